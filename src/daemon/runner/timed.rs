//! A runner that keeps its own time, for the tests of the runner and of the
//! parsers: the spec's timeout, stall action and kill grace turned into the
//! [`Orders`] the daemon's loop gives from a session's machine
//! (`daemon::machine`). The daemon itself never uses it.

use super::*;

pub(super) async fn run(
    spec: SessionSpec,
    observer: &mut dyn OutputObserver,
    mut stop: watch::Receiver<bool>,
    spawned: Option<oneshot::Sender<u32>>,
) -> RunReport {
    let n = spec.iteration;
    let (timeout, grace) = (spec.timeout, spec.kill_grace);
    let stall_stops = spec.stall_action == StallAction::Stop;
    let (tx, rx) = watch::channel(Orders {
        stop: *stop.borrow_and_update(),
        ..Orders::default()
    });
    let launched = match launch(spec, &rx) {
        Ok(l) => l,
        Err(report) => return *report,
    };
    let mut observer = Stalls {
        inner: observer,
        tx: &tx,
        n,
        stall_stops,
    };
    let keeper = async {
        let mut seen = tx.subscribe();
        let timeout = tokio::time::sleep(timeout);
        tokio::pin!(timeout);
        let mut stop_open = true;
        while seen.borrow_and_update().end_of(n).is_none() {
            tokio::select! {
                () = &mut timeout => tx.send_modify(|o| {
                    o.end.get_or_insert((n, Ending::TimedOut));
                }),
                changed = stop.changed(), if stop_open => match changed {
                    Ok(()) if *stop.borrow_and_update() => tx.send_modify(|o| o.stop = true),
                    Ok(()) => {}
                    Err(_) => stop_open = false,
                },
                _ = seen.changed() => {}
            }
        }
        tokio::time::sleep(grace).await;
        tx.send_modify(|o| o.kill = Some(n));
        std::future::pending::<()>().await;
    };
    tokio::select! {
        report = launched.run(&mut observer, rx.clone(), spawned) => report,
        () = keeper => unreachable!("the keeper never ends"),
    }
}

/// Passes everything on; a stall with [`StallAction::Stop`] orders the end.
struct Stalls<'a> {
    inner: &'a mut dyn OutputObserver,
    tx: &'a watch::Sender<Orders>,
    n: u32,
    stall_stops: bool,
}

impl OutputObserver for Stalls<'_> {
    fn on_output(&mut self, chunk: &[u8]) {
        self.inner.on_output(chunk);
    }
    fn on_stream_output(&mut self, stream: OutputStream, chunk: &[u8]) {
        self.inner.on_stream_output(stream, chunk);
    }
    fn on_stall(&mut self, silent_for: Duration) {
        self.inner.on_stall(silent_for);
        if self.stall_stops {
            let n = self.n;
            self.tx.send_modify(|o| {
                o.end.get_or_insert((n, Ending::Stalled { silent_for }));
            });
        }
    }
    fn on_terminate(&mut self, why: &Ending) {
        self.inner.on_terminate(why);
    }
}
