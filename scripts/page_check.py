#!/usr/bin/env python3
"""Opens the broker's live shard page (GET /) in headless Chromium through chromedriver
(selenium) and checks it: every chart canvas has plotted points and painted pixels, the
topic table lists the expected topics with their shard, a shard is marked hottest, and
the browser console has no errors. Saves a screenshot.

Usage: page_check.py [--hot=TOPIC] HTTP_ADDR SCREENSHOT.png TOPIC [TOPIC...]
(--hot: the shard that owns TOPIC must be the one marked hottest; the replication
panel must be hidden: a standalone broker)
       page_check.py --cluster HTTP_ADDR SCREENSHOT.png TOPIC [TOPIC...]
(a cluster member: only the replication panel, which must list each TOPIC with its
leader and three replicas, and the console)
Environment: PAGE_WAIT_S (seconds of samples to collect first, default 8),
CHROMEDRIVER (default: chromedriver on PATH), CHROMIUM (default: chromium on PATH).
Exits 0 when every check passes, 1 otherwise (one FAIL line per problem).
"""
import base64
import json
import os
import shutil
import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        return 2
    args = sys.argv[1:]
    hot_topic = None
    cluster = False
    if args and args[0].startswith("--hot="):
        hot_topic = args.pop(0)[len("--hot="):]
    if args and args[0] == "--cluster":
        cluster = True
        args.pop(0)
    addr, shot, topics = args[0], args[1], args[2:]
    wait_s = float(os.environ.get("PAGE_WAIT_S", "8"))
    opts = webdriver.ChromeOptions()
    binary = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if binary:
        opts.binary_location = binary
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1440,1400", "--force-device-scale-factor=1", "--hide-scrollbars"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver_path = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
    service = Service(executable_path=driver_path) if driver_path else Service()
    driver = webdriver.Chrome(service=service, options=opts)
    failures = []

    def check(ok, what):
        print(("PASS " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    try:
        driver.set_page_load_timeout(30)
        driver.get(f"http://{addr}/")
        check(driver.title == "nsqd shards", f"page title is 'nsqd shards' (got {driver.title!r})")
        if cluster:
            return cluster_checks(driver, check, topics, failures)
        # Let the page collect a few seconds of samples (rates need two).
        deadline = time.time() + wait_s + 20
        while time.time() < deadline:
            n = driver.execute_script("return window.shardsPage ? window.shardsPage.samples() : 0")
            if n >= wait_s:
                break
            time.sleep(0.5)
        samples = driver.execute_script("return window.shardsPage.samples()")
        check(samples >= 3, f"the page polled at least 3 samples (got {samples})")

        # Charts: data points and painted pixels in every canvas.
        charts = driver.execute_script(
            """
            return Array.from(document.querySelectorAll('#charts canvas')).map((c) => {
              const g = c.getContext('2d');
              const d = g.getImageData(0, 0, c.width, c.height).data;
              let colored = 0;  // saturated pixels: the shard lines, not the grey grid/labels
              for (let i = 0; i < d.length; i += 4) {
                const r = d[i], gg = d[i + 1], b = d[i + 2], a = d[i + 3];
                if (a > 128 && Math.max(r, gg, b) - Math.min(r, gg, b) > 60) colored++;
              }
              return {series: c.dataset.series, points: Number(c.dataset.points), colored,
                      w: c.width, h: c.height};
            });
            """
        )
        check(len(charts) == 8, f"8 charts (got {len(charts)})")
        for c in charts:
            check(c["points"] >= 2 and c["colored"] > 0,
                  f"chart {c['series']}: {c['points']} points, {c['colored']} line pixels")
        ins = driver.execute_script(
            "return document.querySelector('#charts canvas[data-series=in]')"
            ".parentNode.querySelector('.now').textContent")
        check(ins.startswith("total ") and ins != "total 0",
              f"messages in /s shows traffic ({ins!r})")

        # Shard cards and the hottest shard.
        cards = driver.execute_script("return document.querySelectorAll('#cards .card').length")
        check(cards >= 1, f"one card per shard ({cards})")
        hot = driver.execute_script("return document.querySelectorAll('#cards .card.hot').length")
        check(hot == 1, f"exactly one shard highlighted as hottest ({hot})")

        # The table lists every topic, with a shard.
        rows = driver.execute_script(
            """
            return Array.from(document.querySelectorAll('#rows tr')).map((tr) => ({
              kind: tr.className.split(' ')[0], topic: tr.dataset.topic, channel: tr.dataset.channel,
              cells: Array.from(tr.children).map((td) => td.textContent)}));
            """
        )
        listed = {r["topic"] for r in rows if r["kind"] == "topic"}
        for t in topics:
            check(t in listed, f"table lists topic {t}")
        for r in rows:
            if r["kind"] == "topic" and r["topic"] in topics:
                check(r["cells"][2] != "?", f"topic {r['topic']} has a shard ({r['cells'][2]})")
        check(any(r["kind"] == "channel" for r in rows), "table lists channels")
        # The lag columns (the broker runs with --channel-lag-stats): a channel with a
        # backlog shows the age of its oldest unfinished message.
        check(all(len(r["cells"]) == 11 for r in rows), "every row has the 11 columns")
        check(any(r["kind"] == "channel" and r["cells"][9] not in ("\u2013", "0 ms") for r in rows),
              "a channel shows the age of its oldest unfinished message")
        if hot_topic:
            hot_shard = driver.execute_script(
                "const c = document.querySelector('#cards .card.hot'); return c ? c.dataset.shard : null")
            owner = next((r["cells"][2] for r in rows if r["kind"] == "topic" and r["topic"] == hot_topic), None)
            check(hot_shard is not None and hot_shard == owner,
                  f"the hottest shard ({hot_shard}) owns {hot_topic} ({owner})")

        # Sorting: click "Messages" (descending first), then back to the grouped order.
        driver.execute_script("document.querySelector('#topics th[data-key=messages]').click()")
        order = driver.execute_script(
            "return Array.from(document.querySelectorAll('#rows tr')).map(tr => tr.dataset.topic + '/' + tr.dataset.channel)")
        sorted_ok = driver.execute_script(
            "return document.querySelector('#topics th[data-key=messages]').classList.contains('desc')")
        check(sorted_ok and len(order) == len(rows)
              and (not hot_topic or order[0].startswith(hot_topic + "/")),
              f"table sorts by a clicked column (messages, descending: first {order[:1]})")
        driver.execute_script("document.querySelector('#topics th[data-key=topic]').click()")

        check(driver.execute_script("return document.getElementById('cluster').hidden"),
              "the replication panel is hidden (standalone)")

        # Console: no errors (uncaught exceptions, failed requests, ...).
        logs = driver.get_log("browser")
        errors = [l for l in logs if l.get("level") in ("SEVERE", "ERROR")]
        for e in errors:
            print("console:", json.dumps(e))
        check(not errors, f"no console errors ({len(errors)})")

        # Screenshot of the whole page (DevTools: beyond the viewport).
        time.sleep(1.2)
        width, height = driver.execute_script(
            "return [document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
        png = driver.execute_cdp_cmd("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": min(height, 4000), "scale": 1}})
        os.makedirs(os.path.dirname(os.path.abspath(shot)), exist_ok=True)
        with open(shot, "wb") as f:
            f.write(base64.b64decode(png["data"]))
        check(os.path.getsize(shot) > 10000, f"screenshot ({width}x{height}) saved to {shot}")
    finally:
        driver.quit()
    print(f"{'FAILED' if failures else 'OK'}: {len(failures)} check(s) failed")
    return 1 if failures else 0


def cluster_checks(driver, check, topics, failures):
    """The replication panel of a cluster member lists every topic with a leader and
    three replicas; the console has no errors."""
    deadline = time.time() + 20
    rows = []
    while time.time() < deadline:
        rows = driver.execute_script(
            """
            if (document.getElementById('cluster').hidden) return [];
            return Array.from(document.querySelectorAll('#cluster-rows tr')).map((tr) => ({
              topic: tr.dataset.topic, cells: Array.from(tr.children).map((td) => td.textContent)}));
            """
        )
        if {r["topic"] for r in rows} >= set(topics):
            break
        time.sleep(0.5)
    check(bool(rows), f"the replication panel is shown ({len(rows)} rows)")
    for t in topics:
        row = next((r for r in rows if r["topic"] == t), None)
        check(row is not None, f"the replication panel lists {t}")
        if row:
            check(row["cells"][1] not in ("", "none"), f"{t} has a leader ({row['cells'][1]})")
            check(row["cells"][5].count(":") >= 3, f"{t} names three replicas ({row['cells'][5]})")
    errors = [l for l in driver.get_log("browser") if l.get("level") in ("SEVERE", "ERROR")]
    for e in errors:
        print("console:", json.dumps(e))
    check(not errors, f"no console errors ({len(errors)})")
    print(f"{'FAILED' if failures else 'OK'}: {len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
