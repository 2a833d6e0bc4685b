//! The host: the CPUs this process may run on (shards are pinned to them: see `placement`
//! in the runtime module).

/// CPUs this process may run on, from /proc/self/status (`Cpus_allowed_list`).
pub fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mut cpus = Vec::new();
    if let Some(line) = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")) {
        for part in line["Cpus_allowed_list:".len()..].trim().split(',') {
            let mut it = part.split('-').map(|v| v.trim().parse::<usize>());
            match (it.next(), it.next()) {
                (Some(Ok(a)), Some(Ok(b))) => cpus.extend(a..=b),
                (Some(Ok(a)), None) => cpus.push(a),
                _ => {}
            }
        }
    }
    if cpus.is_empty() {
        let n = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        cpus.extend(0..n);
    }
    cpus
}
