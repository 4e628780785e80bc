//! The store as one process uses it: what a write does when the disk is
//! full, whether (and under what time) the repairs a read makes are
//! noted, and whether replaced files are freed later, off a hook's path. A value the caller builds once and hands down — in its
//! [`super::StateRoot`] and every [`super::AgentDir`] taken from it, or as
//! an argument to a write by path — never a process-wide setting, so two
//! daemons (or two tests) in one process never see each other's.
//!
//! The default does neither, as the CLI wants: a write that hits `ENOSPC`
//! fails at once, and a repair is only printed by its caller. The daemon
//! builds one that prunes what retention allows and collects the repairs
//! it raises as `STATE_CORRUPT`.

use std::fmt;
use std::sync::{Arc, Mutex};

use super::replaced::{Pending, Replaced};
use crate::clock::Timestamp;

/// Frees disk space; returns the bytes freed.
type Reclaimer = dyn Fn() -> u64 + Send + Sync;

/// The time a repair sets a file aside under.
type RepairClock = dyn Fn() -> Timestamp + Send + Sync;

/// See the module's documentation. Cheap to clone (four `Arc`s).
#[derive(Clone, Default)]
pub struct Store {
    reclaimer: Option<Arc<Reclaimer>>,
    repairs: Option<Arc<Repairs>>,
    removals: Option<Arc<Pending>>,
    acknowledging: Option<Arc<Mutex<()>>>,
}

/// The repairs noted (agent, what was done) and the clock they take.
struct Repairs {
    noted: Mutex<Vec<(String, String)>>,
    now: Box<RepairClock>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("reclaims", &self.reclaimer.is_some())
            .field("records_repairs", &self.repairs.is_some())
            .field("defers_removals", &self.removals.is_some())
            .field("acknowledges_one_at_a_time", &self.acknowledging.is_some())
            .finish()
    }
}

impl Store {
    /// This store, a write that fails with `ENOSPC` or `EDQUOT` calling
    /// `reclaim` and trying once more if it freed anything
    /// ([`super::atomic::retrying`]).
    pub fn with_reclaimer(mut self, reclaim: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        self.reclaimer = Some(Arc::new(reclaim));
        self
    }

    /// This store, keeping the repairs its reads and loads make for
    /// [`Store::take_repairs`], and repairing what only such a process
    /// repairs (a bad rotated segment is set aside, under `now`'s time).
    pub fn recording_repairs(
        mut self,
        now: impl Fn() -> Timestamp + Send + Sync + 'static,
    ) -> Self {
        self.repairs = Some(Arc::new(Repairs {
            noted: Mutex::new(Vec::new()),
            now: Box::new(now),
        }));
        self
    }

    /// This store, its staged files ([`super::atomic::commit_all`]) put in
    /// place by exchanging names, the old versions kept under their temp
    /// names until [`Store::take_replaced`] hands them over for removal off
    /// the caller's path ([`super::replaced`]): for the session hooks. Never
    /// for a writer that removes the directories it writes in.
    pub fn deferring_removals(mut self) -> Self {
        self.removals = Some(Arc::default());
        self
    }

    /// This store, acknowledging one session's messages at a time
    /// ([`crate::inbox::acknowledge`]): for a process that records many
    /// sessions' ends at once, on threads of its own (the daemon). Each
    /// acknowledgement is a cross-directory rename per message, and every
    /// such rename on a file system takes the kernel's one rename lock for
    /// it: acknowledgements made together only spin on it against each
    /// other, and against the claims and the senders' renames.
    pub fn acknowledging_one_at_a_time(mut self) -> Self {
        self.acknowledging = Some(Arc::default());
        self
    }

    /// Wait for this store's turn to acknowledge, if it takes turns.
    pub(crate) fn acknowledgement_turn(&self) -> Option<std::sync::MutexGuard<'_, ()>> {
        self.acknowledging
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Where a commit keeps the old versions, if this store defers them.
    pub(crate) fn removals(&self) -> Option<Arc<Pending>> {
        self.removals.clone()
    }

    /// The old versions left since the last call (none unless this store
    /// defers removals).
    pub fn take_replaced(&self) -> Replaced {
        match &self.removals {
            Some(pending) => pending.take(),
            None => Replaced::none(),
        }
    }

    /// Run the reclaimer, if any: the bytes it freed.
    pub fn reclaim(&self) -> u64 {
        self.reclaimer.as_ref().map_or(0, |r| r())
    }

    /// The time a repair is made at, if this store records repairs (the
    /// daemon's); `None` in a process that only reports them.
    pub fn repair_time(&self) -> Option<Timestamp> {
        self.repairs.as_ref().map(|r| (r.now)())
    }

    /// Say that a corrupt file of `agent` (empty: the daemon's own) was set
    /// aside and rebuilt; kept only if this store records repairs.
    pub fn note_repair(&self, agent: &str, note: &str) {
        if let Some(r) = &self.repairs {
            let mut noted = r.noted.lock().unwrap_or_else(|e| e.into_inner());
            noted.push((agent.to_string(), note.to_string()));
        }
    }

    /// The repairs noted since the last call.
    pub fn take_repairs(&self) -> Vec<(String, String)> {
        self.repairs
            .as_ref()
            .map(|r| std::mem::take(&mut *r.noted.lock().unwrap_or_else(|e| e.into_inner())))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_stores_keep_their_own_repairs_and_reclaimers() {
        let t = Timestamp::parse("2026-11-27T07:00:00Z").unwrap();
        let daemon = Store::default()
            .recording_repairs(move || t)
            .with_reclaimer(|| 42);
        let other = Store::default();
        assert_eq!(daemon.reclaim(), 42);
        assert_eq!(other.reclaim(), 0);
        assert_eq!(daemon.repair_time(), Some(t));
        assert_eq!(other.repair_time(), None);
        daemon.clone().note_repair("rio", "set aside");
        other.note_repair("leo", "not kept");
        assert_eq!(other.take_repairs(), vec![]);
        assert_eq!(
            daemon.take_repairs(),
            vec![("rio".to_string(), "set aside".to_string())]
        );
        assert_eq!(daemon.take_repairs(), vec![]);
    }
}
