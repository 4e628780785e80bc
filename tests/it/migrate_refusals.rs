//! `migrate-crontab --apply` on files that are not what they seem (issue
//! 20): a config or crontab given as a symbolic link is written through
//! (the link stays); a line that runs another job besides the session is
//! refused, naming the job, rather than commented out with it; a FIFO, or
//! a file with other hard links, is refused without waiting or changing
//! anything.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::*;

const CRONTAB: &str = "\
MAILTO=ops@example.com
0 22 * * * /opt/teleo-eval/research-session.sh rio >> /opt/teleo-eval/logs/rio.log 2>&1
*/15 * * * * /usr/local/bin/backup-state.sh
";

fn env() -> Env {
    Env::with_config("[[agent]]\nname = \"marcus\"\nkind = \"human\"\n")
}

fn backups(dir: &Path) -> Vec<String> {
    list(dir)
        .into_iter()
        .filter(|n| n.contains(".bak-"))
        .collect()
}

/// Run `migrate-crontab ARGS`, killed if it takes over 30 s: (exit code,
/// stderr). A FIFO must not hang it.
fn migrate(env: &Env, args: &[&str]) -> (Option<i32>, String) {
    let mut all = vec!["migrate-crontab"];
    all.extend_from_slice(args);
    let mut child = env
        .command(&all)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut stderr = child.stderr.take().unwrap();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut said = String::new();
            std::io::Read::read_to_string(&mut stderr, &mut said).unwrap();
            return (status.code(), said);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("migrate-crontab {args:?} still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn apply_writes_through_a_symlinked_config_and_crontab() {
    let env = env();
    // Both files kept elsewhere (a configuration repository), linked.
    let repo = env.tmp("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let real_config = repo.join("agent-state.toml");
    std::fs::rename(&env.config, &real_config).unwrap();
    symlink(&real_config, &env.config).unwrap();
    let real_crontab = repo.join("crontab");
    std::fs::write(&real_crontab, CRONTAB).unwrap();
    let link = env.tmp("crontab.link");
    symlink(&real_crontab, &link).unwrap();
    let config_before = std::fs::read_to_string(&real_config).unwrap();

    let out = env.ok(&["migrate-crontab", link.to_str().unwrap(), "--apply"]);

    for (link, target) in [(&env.config, &real_config), (&link, &real_crontab)] {
        assert!(
            std::fs::symlink_metadata(link)
                .unwrap()
                .file_type()
                .is_symlink(),
            "{} is no longer a link: {out}",
            link.display()
        );
        assert_eq!(&std::fs::read_link(link).unwrap(), target);
    }
    let config = std::fs::read_to_string(&real_config).unwrap();
    assert!(config.contains("name = \"rio\""), "{config}");
    let crontab = std::fs::read_to_string(&real_crontab).unwrap();
    assert!(
        crontab.contains("# agent-state migrate-crontab") && crontab.contains("\n*/15 * * * *"),
        "{crontab}"
    );
    // The backups are beside the files that changed, with their old text.
    let kept: Vec<(PathBuf, String)> = backups(&repo)
        .into_iter()
        .map(|n| {
            let p = repo.join(&n);
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect();
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert!(kept.iter().any(|(_, t)| t == CRONTAB), "{kept:?}");
    assert!(kept.iter().any(|(_, t)| *t == config_before), "{kept:?}");
    env.ok(&["check"]);
}

#[test]
fn a_line_that_also_runs_another_job_is_refused_naming_the_job() {
    let env = env();
    let crontab = env.tmp("crontab");
    let text = format!(
        "{CRONTAB}30 23 * * * /opt/teleo-eval/research-session.sh clay; /usr/local/bin/rotate-logs.sh\n"
    );
    std::fs::write(&crontab, &text).unwrap();
    let config_before = std::fs::read_to_string(&env.config).unwrap();
    let (code, said) = migrate(&env, &[crontab.to_str().unwrap(), "--apply"]);
    assert_eq!(code, Some(65), "{said}");
    assert!(
        said.contains("line 4: it also runs `/usr/local/bin/rotate-logs.sh`"),
        "{said}"
    );
    assert_eq!(std::fs::read_to_string(&crontab).unwrap(), text);
    assert_eq!(std::fs::read_to_string(&env.config).unwrap(), config_before);
    assert_eq!(backups(env.dir.path()), Vec::<String>::new());
}

#[test]
fn a_fifo_or_a_hard_linked_crontab_is_refused_and_nothing_changes() {
    let env = env();
    let fifo = env.tmp("crontab.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let (code, said) = migrate(&env, &[fifo.to_str().unwrap()]);
    assert_eq!(code, Some(65), "{said}");
    assert!(
        said.contains(&format!("{} is not a regular file", fifo.display())),
        "{said}"
    );

    let crontab = env.tmp("crontab");
    std::fs::write(&crontab, CRONTAB).unwrap();
    let other = env.tmp("crontab.other-name");
    std::fs::hard_link(&crontab, &other).unwrap();
    let (code, said) = migrate(&env, &[crontab.to_str().unwrap(), "--apply"]);
    assert_eq!(code, Some(65), "{said}");
    assert!(said.contains("has 2 hard links"), "{said}");
    assert_eq!(std::fs::read_to_string(&other).unwrap(), CRONTAB);
    assert!(
        !std::fs::read_to_string(&env.config)
            .unwrap()
            .contains("rio")
    );
}
