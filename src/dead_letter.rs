//! The dead-letter publisher of one shard (beyond nsqd; docs/dead-letters-and-rate-limits.md):
//! when a channel of this shard holds messages that used up their maximum attempts
//! (`nsq_shards::channel::dead_letters_waiting`), it publishes their bodies, unchanged,
//! to the dead-letter topic `<topic>.dead` through the same owner path as any publish
//! ([`Server::publish_synced`]: this shard, or the owner over the mesh), and only once
//! that publish is synced to disk, whatever the sync policy, has the channel finish
//! them. A crash in between leaves them unfinished in the channel's metadata, so they
//! are dead-lettered again after the restart: at least once, possibly twice, never lost.

use crate::server::Server;
use futures::future::{select, Either};
use nsq_shards::MessageId;
use std::pin::pin;
use std::rc::Rc;
use std::time::Duration;

/// Messages published to a dead-letter topic at once (one MPUB's worth).
const BATCH: usize = 1024;

/// How long the publisher waits after a failed publish (a dead-letter topic whose disk
/// refuses writes, a shard that is exiting) before it tries again.
const RETRY: Duration = Duration::from_secs(1);

/// Runs until the shard shuts down (its dead letters not yet published stay unfinished
/// in the metadata written at shutdown).
pub async fn publisher(server: Rc<Server>) {
    let shard = server.shard.clone();
    loop {
        let woken = pin!(nsq_shards::channel::dead_letters_waiting());
        let stop = pin!(shard.shutdown.wait());
        if let Either::Right(_) = select(woken, stop).await {
            return;
        }
        loop {
            let batches = shard.take_dead_letters();
            if batches.is_empty() {
                break;
            }
            let mut failed = false;
            for b in batches {
                for chunk in b.messages.chunks(BATCH) {
                    let ids: Vec<MessageId> = chunk.iter().map(|m| m.id).collect();
                    if failed {
                        shard.dead_letter_failed(&b.topic, &b.channel, &ids);
                        continue;
                    }
                    let bodies = chunk.iter().map(|m| m.body.clone()).collect();
                    match server
                        .publish_synced(&b.dead_topic, bodies, None, true)
                        .await
                    {
                        Ok(()) => shard.dead_lettered(&b.topic, &b.channel, &ids),
                        Err(e) => {
                            log::error!(
                                "TOPIC({}) CHANNEL({}): dead-letter publish to {} failed - {e}",
                                b.topic,
                                b.channel,
                                b.dead_topic
                            );
                            shard.dead_letter_failed(&b.topic, &b.channel, &ids);
                            failed = true;
                        }
                    }
                }
            }
            if failed {
                let sleep = pin!(glommio::timer::sleep(RETRY));
                let stop = pin!(shard.shutdown.wait());
                if let Either::Right(_) = select(sleep, stop).await {
                    return;
                }
            }
        }
    }
}
