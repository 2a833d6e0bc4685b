//! Removing data: whole segments every channel has passed (nsqd: diskqueue.go
//! moveForward, which deletes a file once it is read), a deleted topic's directory
//! (nsqd: diskqueue Delete), and journal generations covered by `meta.json`.

use super::{idx_path, pidx_path, TopicStore};
use std::path::PathBuf;
use std::rc::Rc;

impl TopicStore {
    /// Deletes whole segments whose records are all below `seq` (retention: every
    /// channel has passed them). The segment being written is kept.
    pub async fn delete_before(&self, seq: u64) {
        let victims: Vec<(u64, PathBuf)> = {
            let segs = self.segments.borrow();
            let last = segs.keys().next_back().copied();
            segs.iter()
                .filter(|(b, s)| Some(**b) != last && s.end_seq <= seq)
                .map(|(b, s)| (*b, s.path.clone()))
                .collect()
        };
        for (b, _) in &victims {
            self.segments.borrow_mut().remove(b);
            self.readers.borrow_mut().remove(b);
            self.blocks.forget(*b);
        }
        self.no_opens().await;
        for (b, p) in victims {
            log::info!("STORE: deleting segment {}", p.display());
            let (Ok(fp), Ok(ip), Ok(pp)) = (
                self.fd_path(&p),
                self.fd_path(&idx_path(&self.dir, b)),
                self.fd_path(&pidx_path(&self.dir, b)),
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
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let topic = name.strip_prefix("t-").unwrap_or(&name).to_string();
        let aside = self.dir.with_file_name(format!(
            ".deleted-{topic}-{}-{:08x}",
            std::process::id(),
            self.salt
        ));
        let moved = std::fs::rename(&self.dir, &aside).is_ok();
        self.destroyed.set(true);
        self.wake.notify();
        let me = self.clone();
        glommio::spawn_local(async move {
            me.close().await;
            me.no_opens().await;
            me.readers.borrow_mut().clear();
            me.segments.borrow_mut().clear();
            let d = if moved { aside } else { me.dir.clone() };
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
    let covered = store.journal_covered.get();
    let gone: Vec<u64> = store
        .journal_files
        .borrow()
        .iter()
        .copied()
        .filter(|g| *g <= covered)
        .collect();
    if gone.is_empty() || store.destroyed.get() {
        return;
    }
    for g in &gone {
        store.journal_files.borrow_mut().remove(g);
    }
    let paths: Vec<_> = gone
        .iter()
        .filter_map(|g| store.fd_path(&crate::journal::path(&store.dir, *g)).ok())
        .collect();
    store.opens.set(store.opens.get() + 1);
    let _ = glommio::executor()
        .spawn_blocking(move || {
            for p in paths {
                let _ = std::fs::remove_file(p);
            }
        })
        .await;
    store.opens.set(store.opens.get() - 1);
}
