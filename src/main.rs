//! `agent-state`: parse the command line, run, exit with a sysexits code.

use std::process::ExitCode;

fn main() -> ExitCode {
    // Like other Unix tools, end quietly when the reader of our output goes
    // away (`agent-state status | head -1`). Commands print only after their
    // state changes are complete, so this never cuts a change short.
    // SAFETY: called first thing, before any other thread exists.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigDfl,
        )
    };
    let parsed =
        agent_state::cli::parse_lenient::<agent_state::cli::Cli>(std::env::args_os().collect());
    let cli = match parsed {
        Ok((cli, warnings)) => {
            for w in warnings {
                eprintln!("agent-state: warning: {w}");
            }
            cli
        }
        Err(e) => e.exit(),
    };
    match agent_state::cli::run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("agent-state: error: {e}");
            if let Some(hint) = agent_state::access::hint(&e) {
                eprintln!("  {hint}");
            }
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                // Io errors already print their source in the message.
                if !matches!(e, agent_state::error::Error::Io { .. }) {
                    eprintln!("  caused by: {s}");
                }
                source = s.source();
            }
            ExitCode::from(e.exit_code())
        }
    }
}
