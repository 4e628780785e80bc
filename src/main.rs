//! `agent-state`: parse the command line, run, exit with a sysexits code.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = agent_state::cli::Cli::parse();
    match agent_state::cli::run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("agent-state: error: {e}");
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
