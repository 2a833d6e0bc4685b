//! nsqd's route table and what julienschmidt/httprouter v1.3 (nsqd's router) does with
//! a path it has no route for: redirect a trailing slash or an unclean or differently
//! cased path to the route (301 for GET, 307 for other methods; the query is kept),
//! list the methods of a path for OPTIONS and 405, else 404.

use super::Response;
use nsq_wire::http1::clean_path;

/// `(method, path)` of every route with a fixed path; `/config/:opt` is matched apart.
const ROUTES: &[(&str, &str)] = &[
    ("GET", "/ping"),
    ("GET", "/info"),
    ("GET", "/stats"),
    ("GET", "/metrics"),
    ("GET", "/shards"),
    ("GET", "/cluster"),
    ("GET", "/"),
    ("POST", "/pub"),
    ("POST", "/mpub"),
    ("POST", "/topic/create"),
    ("POST", "/topic/delete"),
    ("POST", "/topic/empty"),
    ("POST", "/topic/pause"),
    ("POST", "/topic/unpause"),
    ("POST", "/topic/move-leader"),
    ("POST", "/channel/create"),
    ("POST", "/channel/delete"),
    ("POST", "/channel/empty"),
    ("POST", "/channel/pause"),
    ("POST", "/channel/unpause"),
    ("POST", "/channel/seek"),
    ("GET", "/message"),
    ("GET", "/messages"),
    ("POST", "/channel/max-attempts"),
    ("POST", "/channel/rate-limit"),
];

/// The methods with a route tree (httprouter redirects only within one).
const TREES: &[&str] = &["GET", "POST", "PUT"];

const CONFIG: &str = "/config/";

/// `/config/:opt`: one non-empty segment after `/config/`.
fn config_opt(path: &str) -> Option<&str> {
    let opt = path.strip_prefix(CONFIG)?;
    (!opt.is_empty() && !opt.contains('/')).then_some(opt)
}

/// Whether `method` has a route for exactly `path`.
pub(super) fn has_route(method: &str, path: &str) -> bool {
    ROUTES.iter().any(|&(m, p)| m == method && p == path)
        || (matches!(method, "GET" | "PUT") && config_opt(path).is_some())
}

/// The methods `path` has routes for (exact match), in nsqd's table order.
pub(super) fn allowed_methods(path: &str) -> Vec<&'static str> {
    if path == "*" {
        return TREES.to_vec();
    }
    TREES
        .iter()
        .copied()
        .filter(|m| has_route(m, path))
        .collect()
}

/// The route `path` matches ignoring ASCII case (httprouter findCaseInsensitivePath),
/// as the route spells it (a `:opt` value is kept as sent).
fn case_insensitive(method: &str, path: &str) -> Option<String> {
    if let Some(&(_, p)) = ROUTES
        .iter()
        .find(|&&(m, p)| m == method && p.eq_ignore_ascii_case(path))
    {
        return Some(p.to_string());
    }
    if matches!(method, "GET" | "PUT")
        && path.len() > CONFIG.len()
        && path.is_char_boundary(CONFIG.len())
        && path[..CONFIG.len()].eq_ignore_ascii_case(CONFIG)
        && config_opt(&format!("{CONFIG}{}", &path[CONFIG.len()..])).is_some()
    {
        return Some(format!("{CONFIG}{}", &path[CONFIG.len()..]));
    }
    None
}

/// The redirect httprouter answers for `method` and `path` without a route, if any.
pub(super) fn redirect(method: &str, path: &str, query: &str) -> Option<Response> {
    // An empty path (an opaque target such as `http:x`) is not redirected: Go's
    // CleanPath makes it `/`, which nsqd has no route for (the broker's page there is
    // its own).
    if !TREES.contains(&method) || path == "/" || path.is_empty() {
        return None;
    }
    let trimmed = path.strip_suffix('/').filter(|t| !t.is_empty());
    let target = trimmed
        .filter(|t| has_route(method, t))
        .map(str::to_string)
        .or_else(|| {
            let clean = clean_path(path);
            case_insensitive(method, &clean).or_else(|| {
                let t = clean.strip_suffix('/').filter(|t| !t.is_empty())?;
                case_insensitive(method, t)
            })
        })?;
    let location = if query.is_empty() {
        target
    } else {
        format!("{target}?{query}")
    };
    // Go's http.Redirect: an HTML body only for GET.
    let (status, headers, body) = if method == "GET" {
        let href = location
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&#34;")
            .replace('\'', "&#39;");
        (
            301,
            vec![
                ("Content-Type", "text/html; charset=utf-8".to_string()),
                ("Location", location),
            ],
            format!("<a href=\"{href}\">Moved Permanently</a>.\n\n").into_bytes(),
        )
    } else {
        (307, vec![("Location", location)], Vec::new())
    };
    Some(Response {
        status,
        headers,
        body,
        sniffed_type: None,
        close: false,
        http10: false,
        keep_alive_header: false,
        body_read: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_paths_as_httprouter() {
        for (input, want) in [
            ("//ping", "/ping"),
            ("/a/../ping", "/ping"),
            ("/ping/", "/ping/"),
            ("ping", "/ping"),
            ("/./x/./y/..//z/", "/x/z/"),
            ("/..", "/"),
        ] {
            assert_eq!(clean_path(input), want, "{input}");
        }
    }

    #[test]
    fn redirects_as_httprouter() {
        let loc = |m: &str, p: &str, q: &str| {
            redirect(m, p, q).map(|r| {
                let l = r
                    .headers
                    .iter()
                    .find(|h| h.0 == "Location")
                    .unwrap()
                    .1
                    .clone();
                (r.status, l)
            })
        };
        for (m, p, q, want) in [
            ("GET", "/ping/", "", Some((301, "/ping"))),
            ("GET", "/PING", "", Some((301, "/ping"))),
            (
                "GET",
                "/stats/",
                "format=json",
                Some((301, "/stats?format=json")),
            ),
            ("POST", "/pub/", "topic=t", Some((307, "/pub?topic=t"))),
            (
                "GET",
                "/Config/Log_Level",
                "",
                Some((301, "/config/Log_Level")),
            ),
            ("PUT", "/config/x/", "", Some((307, "/config/x"))),
            ("GET", "/pub", "", None),
            ("HEAD", "/ping/", "", None),
            ("GET", "/nope", "", None),
            ("GET", "/", "", None),
        ] {
            let want = want.map(|(c, l): (u16, &str)| (c, l.to_string()));
            assert_eq!(loc(m, p, q), want, "{m} {p}?{q}");
        }
    }
}
