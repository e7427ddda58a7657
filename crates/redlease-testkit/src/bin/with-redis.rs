//! `with-redis CMD [ARGS...]`: starts a throwaway redis-server on a free loopback port,
//! runs CMD with `REDIS_URL` pointing at it, stops the server, and exits with CMD's
//! status. Used to run the examples against a real server in CI.

use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1).skip_while(|a| a == "--");
    let Some(program) = args.next() else {
        eprintln!("usage: with-redis CMD [ARGS...]");
        return ExitCode::from(2);
    };
    let server = match redlease_testkit::RedisServer::start() {
        Ok(server) => server,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(69);
        }
    };
    let status = Command::new(&program)
        .args(args)
        .env("REDIS_URL", server.url())
        .status();
    match status {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!("with-redis: {program} exited with {status}; redis-server log follows");
            eprintln!("{}", server.log());
            ExitCode::from(status.code().map_or(1, |c| c.clamp(1, 255) as u8))
        }
        Err(e) => {
            eprintln!("error: cannot run {program}: {e}");
            ExitCode::from(127)
        }
    }
}
