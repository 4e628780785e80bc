//! Who may answer a flow's question (approve, reject, stop a cycle): the
//! decision, over unix users, and the few look-ups it needs.
//!
//! A message's `from` is whatever its sender wrote, so it proves nothing;
//! what the kernel records does: the user running `flow approve|reject|stop`
//! and the owner of a reply's file in an inbox (`inbox/` is sticky: nobody
//! but its owner, the service user and root can replace a message there).
//!
//! - `flow approve|reject|stop`: root, the service user (the state root's
//!   owner) or a user in the flow's `approvers`.
//! - A reply to the flow's question: a file owned by root or by a user in
//!   `approvers`. Not the service user's: every agent's session runs as it,
//!   so its files say nothing about a human.
//!
//! This module must never decide from a message's `from` or `--by`.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::unistd::{Uid, User};

/// A unix user: its uid and, if the system knows it, its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnixUser {
    pub uid: u32,
    pub name: Option<String>,
}

impl UnixUser {
    pub fn of_uid(uid: u32) -> UnixUser {
        UnixUser {
            uid,
            name: User::from_uid(Uid::from_raw(uid))
                .ok()
                .flatten()
                .map(|u| u.name),
        }
    }

    /// The user running this process (its effective uid).
    pub fn current() -> UnixUser {
        UnixUser::of_uid(nix::unistd::geteuid().as_raw())
    }

    /// The owner of `path` (never following a link).
    pub fn owner_of(path: &Path) -> std::io::Result<UnixUser> {
        Ok(UnixUser::of_uid(std::fs::symlink_metadata(path)?.uid()))
    }

    /// `marcus (uid 1001)`, or `uid 1001` for a user the system does not name.
    pub fn describe(&self) -> String {
        match &self.name {
            Some(n) => format!("{n} (uid {})", self.uid),
            None => format!("uid {}", self.uid),
        }
    }

    fn is_approver(&self, approvers: &[String]) -> bool {
        self.name.as_ref().is_some_and(|n| approvers.contains(n))
    }
}

/// May `user` run `flow approve|reject|stop`?
pub fn may_command(user: &UnixUser, service_uid: u32, approvers: &[String]) -> bool {
    user.uid == 0 || user.uid == service_uid || user.is_approver(approvers)
}

/// Is a reply whose file `owner` owns a human's answer?
pub fn may_reply(owner: &UnixUser, approvers: &[String]) -> bool {
    owner.uid == 0 || owner.is_approver(approvers)
}

pub use crate::config::check_user_name;

#[cfg(test)]
mod tests {
    use super::*;

    fn user(uid: u32, name: &str) -> UnixUser {
        UnixUser {
            uid,
            name: Some(name.to_string()),
        }
    }

    #[test]
    fn who_may_answer_a_flow() {
        let approvers = vec!["marcus".to_string()];
        let service = 990;
        // (user, by command, by reply)
        let table = [
            (user(0, "root"), true, true),
            (user(990, "agent-state"), true, false),
            (user(1001, "marcus"), true, true),
            (user(1002, "eve"), false, false),
            (
                UnixUser {
                    uid: 1003,
                    name: None,
                },
                false,
                false,
            ),
        ];
        for (u, command, reply) in table {
            assert_eq!(may_command(&u, service, &approvers), command, "{u:?}");
            assert_eq!(may_reply(&u, &approvers), reply, "{u:?}");
        }
        // Without approvers only root and the service user answer, and only root by reply.
        assert!(!may_reply(&user(1001, "marcus"), &[]));
        assert!(!may_command(&user(1001, "marcus"), service, &[]));
    }

    #[test]
    fn approver_names_are_unix_user_names() {
        for ok in ["marcus", "_svc", "a-b_c9", "machine$"] {
            assert_eq!(check_user_name(ok), Ok(()), "{ok}");
        }
        for bad in ["", "Marcus", "9lives", "a b", "a/b", &"x".repeat(33)] {
            assert!(check_user_name(bad).is_err(), "{bad}");
        }
    }
}
