//! A running session's output, from its pipes to the stream, through its
//! spool file ([`super::spool`]):
//!
//! - the pipes are read as the session writes (at most 16 KiB a chunk)
//!   and every chunk is numbered and appended to the spool file at once:
//!   the session never waits for NATS, only for the disk;
//! - a publisher stores the spooled chunks in the stream one by one, in
//!   order, each before the next, retrying while NATS does not store
//!   (said once per outage, and again when it stores); when it has stored
//!   all that was written, the file is cut back;
//! - the bytes written and not yet stored are bounded (`--max-spool`,
//!   256 MiB by default): past it the session is ended
//!   ([`agent_state_cluster::Outcome::SpoolFull`]) and what it prints
//!   while it ends is dropped, counted in the log.
//!
//! Every chunk read also sets the time of the session's last output, for
//! its stall timer ([`super::stall`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_state_cluster::{Bytes, Output};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::log;
use super::spool::{Record, SpoolFile};

/// One read of a session's pipe: at most one chunk.
const CHUNK_BYTES: usize = 16 * 1024;
/// How long a publisher waits before it tries a chunk again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

pub(super) type Shared = Arc<Mutex<SpoolFile>>;

fn lock(spool: &Shared) -> std::sync::MutexGuard<'_, SpoolFile> {
    spool.lock().unwrap_or_else(|e| e.into_inner())
}

/// A session's output on its way.
pub(super) struct Relay {
    pub spool: Shared,
    /// When it last printed (its start, at first).
    pub last_output: watch::Receiver<Instant>,
    /// Fires once the spool passed its limit.
    pub full: oneshot::Receiver<()>,
    readers: Vec<JoinHandle<()>>,
    spooled: watch::Receiver<u64>,
    spooler: JoinHandle<u64>,
    pub publisher: JoinHandle<u64>,
}

impl Relay {
    /// Starts reading `pipes` into `spool` and publishing from it.
    pub fn start(
        output: Output,
        id: &str,
        spool: SpoolFile,
        limit: u64,
        pipes: Vec<(&'static str, Box<dyn AsyncRead + Unpin + Send>)>,
    ) -> Relay {
        let spool = Arc::new(Mutex::new(spool));
        let (tx, rx) = mpsc::channel::<(&'static str, Bytes)>(16);
        let readers = pipes
            .into_iter()
            .map(|(name, pipe)| tokio::spawn(read_pipe(pipe, name, tx.clone())))
            .collect();
        drop(tx);
        let (spooled_tx, spooled_rx) = watch::channel(0u64);
        let (last_tx, last_output) = watch::channel(Instant::now());
        let (full_tx, full) = oneshot::channel();
        let spooler = tokio::spawn(spool_chunks(
            id.to_string(),
            rx,
            spool.clone(),
            spooled_tx,
            last_tx,
            limit,
            full_tx,
        ));
        let publisher = tokio::spawn(publish_spooled(
            output,
            id.to_string(),
            spool.clone(),
            spooled_rx.clone(),
        ));
        Relay {
            spooled: spooled_rx,
            spool,
            last_output,
            full,
            readers,
            spooler,
            publisher,
        }
    }

    /// Once the session's processes are gone: waits (at most `within`)
    /// for its pipes to close, and returns the number of the last chunk
    /// spooled. A process that escaped the session and holds a pipe open
    /// does not hold the end back longer.
    pub async fn pipes_closed(&mut self, id: &str, within: Duration) -> u64 {
        let abort = self.spooler.abort_handle();
        match tokio::time::timeout(within, &mut self.spooler).await {
            Ok(Ok(n)) => return n,
            Ok(Err(_)) => {}
            Err(_) => log(format!(
                "session {id}: its output pipes stayed open {within:?} after it ended (a process outside its group holds them); the end is sent without the rest"
            )),
        }
        for reader in &self.readers {
            reader.abort();
        }
        abort.abort();
        // What was spooled is what the publisher will store.
        *self.spooled.borrow()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        for reader in &self.readers {
            reader.abort();
        }
        self.spooler.abort();
        self.publisher.abort();
    }
}

async fn read_pipe(
    mut pipe: Box<dyn AsyncRead + Unpin + Send>,
    name: &'static str,
    tx: mpsc::Sender<(&'static str, Bytes)>,
) {
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if tx
                    .send((name, Bytes::copy_from_slice(&buf[..n])))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}

/// Whether a chunk of `len` bytes fits: `unread` bytes are spooled and not
/// yet stored, at most `limit`. Pure.
pub fn fits(unread: u64, len: u64, limit: u64) -> bool {
    unread.saturating_add(len) <= limit
}

/// Numbers the chunks from 1 and appends each to the spool; returns the
/// last number once both pipes are closed.
async fn spool_chunks(
    id: String,
    mut rx: mpsc::Receiver<(&'static str, Bytes)>,
    spool: Shared,
    spooled: watch::Sender<u64>,
    last_output: watch::Sender<Instant>,
    limit: u64,
    full: oneshot::Sender<()>,
) -> u64 {
    let mut number = 0u64;
    let mut full = Some(full);
    let mut dropped = 0u64;
    let mut write_failed = false;
    while let Some((pipe, data)) = rx.recv().await {
        last_output.send_replace(Instant::now());
        let len = data.len() as u64;
        if full.is_none() {
            dropped += len;
            continue;
        }
        if !fits(lock(&spool).unread(), len, limit) {
            log(format!(
                "session {id}: its output spool holds {} MiB that NATS has not stored, its limit (--max-spool); ending it",
                limit >> 20
            ));
            if let Some(full) = full.take() {
                let _ = full.send(());
            }
            dropped += len;
            continue;
        }
        let next = number + 1;
        let file = spool.clone();
        let written =
            tokio::task::spawn_blocking(move || lock(&file).append(next, pipe, &data)).await;
        match written {
            Ok(Ok(())) => {
                number = next;
                spooled.send_replace(number);
            }
            Ok(Err(e)) => {
                if !write_failed {
                    log(format!(
                        "session {id}: cannot write its output spool {}: {e}; its output is lost while this lasts",
                        lock(&spool).path().display()
                    ));
                }
                write_failed = true;
                dropped += len;
            }
            Err(_) => dropped += len,
        }
    }
    if dropped > 0 {
        log(format!(
            "session {id}: {dropped} byte(s) of its output were not spooled (see above)"
        ));
    }
    number
}

/// Stores the spooled chunks in order, each before the next, retrying while
/// NATS does not store; returns the last stored once the spooler is done
/// and everything it wrote is stored.
async fn publish_spooled(
    output: Output,
    id: String,
    spool: Shared,
    mut spooled: watch::Receiver<u64>,
) -> u64 {
    let mut stored = 0u64;
    loop {
        spooled.borrow_and_update();
        let file = spool.clone();
        let next = tokio::task::spawn_blocking(move || lock(&file).read_next()).await;
        match next {
            Ok(Ok(Some(Record::Chunk { number, pipe, data }))) => {
                store_chunk(&output, &id, number, pipe, Bytes::from(data)).await;
                stored = number;
                let file = spool.clone();
                let cut = tokio::task::spawn_blocking(move || lock(&file).cut_back_if_read()).await;
                if let Ok(Err(e)) = cut {
                    log(format!("session {id}: cannot cut its spool back: {e}"));
                }
            }
            // The end is the session's to store, after the chunks.
            Ok(Ok(Some(Record::End(_)))) => {}
            Ok(Ok(None)) => {
                if spooled.changed().await.is_err() {
                    return stored;
                }
            }
            Ok(Err(e)) => {
                log(format!(
                    "session {id}: cannot read its output spool: {e}; the rest of its output is not stored"
                ));
                return stored;
            }
            Err(_) => return stored,
        }
    }
}

/// Stores one chunk, retrying until NATS stores it (the caller bounds how
/// long it waits); says the outage once and its end.
pub(super) async fn store_chunk(output: &Output, id: &str, number: u64, pipe: &str, data: Bytes) {
    let mut failing: Option<Instant> = None;
    loop {
        match output.chunk(id, number, pipe, data.clone()).await {
            Ok(()) => {
                if let Some(since) = failing {
                    log(format!(
                        "session {id}: NATS stores its output again (after {:?}); publishing from its spool",
                        since.elapsed()
                    ));
                }
                return;
            }
            Err(e) => {
                if failing.is_none() {
                    log(format!(
                        "{e}; its output stays in its spool, published when NATS stores again"
                    ));
                    failing = Some(Instant::now());
                }
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_spool_is_bounded_by_what_is_not_stored() {
        const MIB: u64 = 1 << 20;
        // (unread, chunk, limit, fits)
        let table = [
            (0, 16 * 1024, 256 * MIB, true),
            (256 * MIB - 10, 10, 256 * MIB, true),
            (256 * MIB - 10, 11, 256 * MIB, false),
            (u64::MAX, 1, 256 * MIB, false),
            (0, 1, 0, false),
        ];
        for (unread, len, limit, want) in table {
            assert_eq!(
                super::fits(unread, len, limit),
                want,
                "{unread} {len} {limit}"
            );
        }
    }
}
