//! `agent-state daemon`: run the service in the foreground (systemd runs it
//! as `Type=notify`; for a local try, `agent-state --config config/dev.toml daemon`).

use crate::cli::Context;
use crate::error::{Error, Result, exit};

#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(ctx: Context, _args: Args) -> Result<u8> {
    // The daemon loads the config itself (and again at each SIGHUP): this
    // copy, which proved the file valid, would stay alive beside it for the
    // daemon's whole life (11 MiB at 10,000 agents).
    let source = ctx.config.source.clone();
    drop(ctx);
    // A session that closes its end of a pipe must never kill the daemon.
    // SAFETY: before the runtime and any other thread start.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigIgn,
        )
    };
    crate::daemon::logging::init();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the async runtime for", "the daemon", e))?;
    runtime.block_on(crate::daemon::service::run(
        &source,
        crate::cli::web::listen,
    ))?;
    Ok(exit::OK)
}
