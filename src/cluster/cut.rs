//! Cutting a member off from its peers while it runs, for tests: its cluster
//! connections stay open and carry nothing, as in a network partition that leaves TCP
//! connections up (docs/replication.md, "Guarantees").
//!
//! Compiled in only with the cargo feature `fault-injection` (the tests enable it;
//! without it [`is_cut`] is a constant `false`). With the feature, the environment
//! variable `NSQD_CLUSTER_CUT_FILE` names a file: while it exists, this member's
//! cluster connections neither write nor read (a thread looks every 5 ms).

/// The environment variable naming the file whose existence cuts the member off.
#[cfg(feature = "fault-injection")]
pub const ENV: &str = "NSQD_CLUSTER_CUT_FILE";

#[cfg(feature = "fault-injection")]
static CUT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How often the file is looked for, and a cut connection looks whether it still is.
#[cfg(feature = "fault-injection")]
const POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// Starts watching the file named by [`ENV`], when set (once per process).
#[cfg(feature = "fault-injection")]
pub fn init_from_env() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    let Some(path) = std::env::var_os(ENV) else {
        return;
    };
    STARTED.call_once(|| {
        let path = std::path::PathBuf::from(path);
        let spawned = std::thread::Builder::new()
            .name("cluster-cut".into())
            .spawn(move || loop {
                let cut = path.exists();
                if CUT.swap(cut, std::sync::atomic::Ordering::Relaxed) != cut {
                    log::warn!(
                        "CLUSTER: {} this member's connections to its peers ({ENV})",
                        if cut { "cut" } else { "restored" }
                    );
                }
                std::thread::sleep(POLL);
            });
        if let Err(e) = spawned {
            log::error!("CLUSTER: {ENV} not watched: {e}");
        }
    });
}

/// No fault injection in this build.
#[cfg(not(feature = "fault-injection"))]
pub fn init_from_env() {}

/// Whether the member is cut off from its peers now.
#[cfg(feature = "fault-injection")]
pub fn is_cut() -> bool {
    CUT.load(std::sync::atomic::Ordering::Relaxed)
}

/// Never, in a build without fault injection.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn is_cut() -> bool {
    false
}

/// Waits while the member is cut off.
pub async fn wait() {
    #[cfg(feature = "fault-injection")]
    while is_cut() {
        glommio::timer::sleep(POLL).await;
    }
}
