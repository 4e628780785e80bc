//! systemd notification glue: READY, WATCHDOG, STATUS, STOPPING,
//! EXTEND_TIMEOUT_USEC. Every call is a no-op without `NOTIFY_SOCKET`, and a
//! failure to notify is logged, never fatal.

use std::time::Duration;

use sd_notify::NotifyState;

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("cannot notify systemd: {e}");
    }
}

pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

pub fn watchdog() {
    send(&[NotifyState::Watchdog]);
}

pub fn reloading() {
    send(&[
        NotifyState::Reloading,
        NotifyState::monotonic_usec_now().unwrap_or(NotifyState::Status("reloading")),
    ]);
}

pub fn stopping(status: &str, extend: Duration) {
    let usec = extend.as_micros().min(u32::MAX as u128) as u32;
    send(&[
        NotifyState::Stopping,
        NotifyState::Status(status),
        NotifyState::ExtendTimeoutUsec(usec),
    ]);
}

/// Ask for more time to start (EXTEND_TIMEOUT_USEC before READY=1).
pub fn extend_start(by: Duration) {
    let usec = by.as_micros().min(u32::MAX as u128) as u32;
    send(&[
        NotifyState::Status("starting: bootstrapping agents"),
        NotifyState::ExtendTimeoutUsec(usec),
    ]);
}

/// How often to send WATCHDOG=1: half the configured interval.
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled().map(|d| d / 2)
}
