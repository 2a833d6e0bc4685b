//! Removing data: whole segments every channel has passed (nsqd: diskqueue.go
//! moveForward, which deletes a file once it is read), a deleted topic's directory
//! (nsqd: diskqueue Delete), and journal generations covered by `meta.json`.

use super::{idx_path, pidx_path, TopicStore};
use std::rc::Rc;

impl TopicStore {
    /// Deletes whole segments whose records are all below `seq` (retention: every
    /// channel has passed them). The segment being written is kept.
    pub async fn delete_before(&self, seq: u64) {
        let victims = self.segments.take_passed(seq);
        self.dir.no_opens().await;
        for (b, p) in victims {
            log::info!("STORE: deleting segment {}", p.display());
            let (Ok(fp), Ok(ip), Ok(pp)) = (
                self.dir.fd_path(&p),
                self.dir.fd_path(&idx_path(self.dir.path(), b)),
                self.dir.fd_path(&pidx_path(self.dir.path(), b)),
            ) else {
                continue;
            };
            let _ = glommio::executor()
                .spawn_blocking(move || {
                    let _ = std::fs::remove_file(ip);
                    let _ = std::fs::remove_file(pp);
                    std::fs::remove_file(fp)
                })
                .await;
        }
    }

    /// Topic delete: moves the directory aside at once (so a topic of the same name can
    /// start afresh), then stops the writer and removes the files in the background.
    /// The aside name holds the process id and this store's random salt, unique among
    /// the stores a process creates (if a name is taken anyway, the directory is removed
    /// where it is).
    pub fn destroy(self: &Rc<Self>) {
        let name = self
            .dir
            .path()
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let topic = name.strip_prefix("t-").unwrap_or(&name).to_string();
        let aside = self.dir.path().with_file_name(format!(
            ".deleted-{topic}-{}-{:08x}",
            std::process::id(),
            self.salt
        ));
        let moved = std::fs::rename(self.dir.path(), &aside).is_ok();
        self.dir.mark_deleted();
        self.life.wake();
        let me = self.clone();
        glommio::spawn_local(async move {
            me.close().await;
            me.dir.no_opens().await;
            me.segments.clear();
            let d = if moved {
                aside
            } else {
                me.dir.path().to_path_buf()
            };
            let _ = glommio::executor()
                .spawn_blocking(move || std::fs::remove_dir_all(d))
                .await;
            crate::store_released();
        })
        .detach();
    }
}

/// Deletes the journal files of generations covered by the last `meta.json`.
pub(super) async fn delete_covered_journals(store: &TopicStore) {
    if store.dir.is_deleted() {
        return;
    }
    let gone = store.journal.take_covered_files();
    if gone.is_empty() {
        return;
    }
    let paths: Vec<_> = gone
        .iter()
        .filter_map(|g| {
            let path = crate::journal::path(store.dir.path(), *g);
            store.dir.fd_path(&path).ok()
        })
        .collect();
    store.dir.begin_open();
    let _ = glommio::executor()
        .spawn_blocking(move || {
            for p in paths {
                let _ = std::fs::remove_file(p);
            }
        })
        .await;
    store.dir.end_open();
}
