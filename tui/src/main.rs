//! `coli`: chat with colibri in the terminal, with a live dashboard of its expert tiers.

use std::ffi::OsString;
use std::io::{stdout, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use crossterm::event::{
    DisableBracketedPaste, EnableBracketedPaste, KeyboardEnhancementFlags,
    PopKeyboardEnhancementFlags, PushKeyboardEnhancementFlags,
};
use crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};
use crossterm::{cursor, execute};
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;

use coli::app::{App, Config};
use coli::attach::http::Endpoint;
use coli::attach::Attached;
use coli::io::{default_daemon_path, spawn_terminal_threads, DaemonSpec, Supervisor};

/// Chat with colibri in the terminal, with a live dashboard of its expert tiers.
///
/// Starts `colibri serve` (the binary next to `coli`, or --daemon) on the bundled demo model,
/// or on --snap DIR; options after `--` go to the daemon unchanged. With --attach URL it
/// starts nothing: it chats with a running `colibri api` and shows its tiers.
#[derive(Parser, Debug)]
#[command(name = "coli", version, about)]
struct Args {
    /// The colibri executable (default: `colibri` next to `coli`).
    #[arg(long, env = "COLI_DAEMON", value_name = "PATH")]
    daemon: Option<PathBuf>,

    /// Model directory, passed to the daemon (default: its bundled demo model).
    #[arg(long, value_name = "DIR")]
    snap: Option<OsString>,

    /// Run the daemon in mux mode (`colibri serve --mux`): coli templates each slot's
    /// conversation and sends SUBMIT frames, several slots stream at once, and the dashboard
    /// lists the sessions.
    #[arg(long, env = "COLI_MUX", value_parser = clap::builder::BoolishValueParser::new())]
    mux: bool,

    /// Do not open the telemetry channel (`--telemetry-fd 3`); the dashboard then updates at
    /// turn ends only.
    #[arg(long)]
    no_telemetry: bool,

    /// max_tokens of turns on slots > 0, of every turn with --mux (default 256, the daemon's
    /// --ngen default). The legacy protocol caps it at the daemon's --ngen, and slot 0's plain
    /// lines use --ngen itself; `serve --mux` clamps it only to the context room.
    #[arg(long, default_value_t = 256, value_name = "N")]
    max_tokens: u32,

    /// Temperature of turns on slots > 0 (slot 0 uses the daemon's own), of every turn with
    /// --mux.
    #[arg(long, default_value_t = 0.7, value_name = "T")]
    temperature: f64,

    /// Nucleus of turns on slots > 0, of every turn with --mux.
    #[arg(long, default_value_t = 0.9, value_name = "P")]
    top_p: f64,

    /// Seconds to wait, when quitting, for the daemon to save and exit before killing it.
    #[arg(long, default_value_t = 5.0, value_name = "S")]
    quit_grace: f64,

    /// Attach to a running `colibri api` at URL (`http://HOST:PORT`) instead of starting a
    /// daemon: chat through its /v1/chat/completions, the dashboard from its telemetry stream.
    #[arg(long, value_name = "URL")]
    attach: Option<String>,

    /// The server's API key with --attach (default: COLIBRI_API_KEY, else OPENAI_API_KEY).
    #[arg(long, value_name = "KEY", requires = "attach")]
    api_key: Option<String>,

    /// With --attach, no terminal: print the server's model, its first telemetry record, a
    /// short answer (at most 16 tokens) to "Say hello." and the server's STAT of it, then
    /// exit (0; 2 when the server cannot be reached or refuses the key).
    #[arg(long, requires = "attach")]
    check: bool,

    /// Daemon options, after `--` (e.g. `-- --cache 8 --kv-slots 4`).
    #[arg(last = true, value_name = "DAEMON_ARGS")]
    daemon_args: Vec<OsString>,
}

/// Puts the terminal back however `main` ends (return, `?`, panic unwinding).
struct TerminalGuard;

impl TerminalGuard {
    fn enter() -> std::io::Result<TerminalGuard> {
        enable_raw_mode()?;
        let guard = TerminalGuard;
        execute!(stdout(), EnterAlternateScreen, EnableBracketedPaste)?;
        // Lets terminals that speak the kitty protocol report Shift-Enter; others ignore it.
        let _ = execute!(
            stdout(),
            PushKeyboardEnhancementFlags(KeyboardEnhancementFlags::DISAMBIGUATE_ESCAPE_CODES)
        );
        Ok(guard)
    }
}

fn restore_terminal() {
    let _ = execute!(
        stdout(),
        PopKeyboardEnhancementFlags,
        DisableBracketedPaste,
        LeaveAlternateScreen,
        cursor::Show
    );
    let _ = disable_raw_mode();
    let _ = stdout().flush();
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

/// What `coli` says outside a terminal, where a full-screen chat cannot run.
pub const NOT_A_TERMINAL: &str = "coli: needs a terminal (its stdin and stdout are not one); \
for scripts and pipes use `colibri run`, e.g. `echo 'Why is the sky blue?' | colibri run`";

/// Experts per layer the bundled demo model keeps in RAM under `coli` (of its 16): with all
/// of them cached the dashboard never moves; with 4 (the router picks 4 per token) every
/// answer shows hits, misses and disk reads.
const DEMO_CACHE: &str = "4";

/// On the demo, a pinned tier of about ten of its 48 experts (from its usage history, filled
/// with unseen ones) that live re-pin reshapes every 8 tokens: the re-pin list moves too. The
/// history exists from the first answer on, so this starts with the second `coli`.
const DEMO_PIN: [&str; 7] = [
    "--pin",
    "auto",
    "--pin-gb",
    "0.002",
    "--pin-fill",
    "1",
    "--repin",
];
const DEMO_REPIN_EVERY: &str = "8";

/// Which tier settings the environment already chose (the daemon reads them there).
#[derive(Clone, Copy, Default)]
struct TierEnv {
    /// `CAP`: experts cached per layer.
    cache: bool,
    /// `PIN`, `PIN_GB` or `REPIN`.
    pin: bool,
}

/// The daemon's arguments: `--snap`, the user's, and on the demo model (no `--snap`
/// anywhere) a small expert cache and a small re-pinned tier unless the user chose their own
/// (`--cache` or `CAP`; `--pin`, `--pin-gb`, `--repin` or their variables).
fn daemon_args(snap: Option<&OsString>, user: &[OsString], env: TierEnv) -> Vec<OsString> {
    let mut v = Vec::new();
    if let Some(snap) = snap {
        v.push(OsString::from("--snap"));
        v.push(snap.clone());
    }
    v.extend(user.iter().cloned());
    let given = |flag: &str| {
        user.iter().any(|a| {
            let a = a.to_string_lossy();
            a == flag || a.starts_with(&format!("{flag}="))
        })
    };
    let demo = snap.is_none() && !given("--snap");
    if demo && !given("--cache") && !env.cache {
        v.push("--cache".into());
        v.push(DEMO_CACHE.into());
    }
    if demo && !["--pin", "--pin-gb", "--repin"].iter().any(|f| given(f)) && !env.pin {
        v.extend(DEMO_PIN.iter().map(OsString::from));
        v.push(DEMO_REPIN_EVERY.into());
    }
    v
}

fn main() -> ExitCode {
    let args = Args::parse();
    if !(args.check || std::io::stdin().is_terminal() && stdout().is_terminal()) {
        eprintln!("{NOT_A_TERMINAL}");
        return ExitCode::from(2);
    }
    if !(0.0..=2.0).contains(&args.temperature) {
        eprintln!(
            "coli: --temperature must be in 0..=2, got {}",
            args.temperature
        );
        return ExitCode::from(2);
    }
    if !(args.top_p > 0.0 && args.top_p <= 1.0) {
        eprintln!("coli: --top-p must be in (0, 1], got {}", args.top_p);
        return ExitCode::from(2);
    }
    if args.max_tokens == 0 || args.max_tokens > i32::MAX as u32 {
        eprintln!("coli: --max-tokens must be in 1..=2147483647");
        return ExitCode::from(2);
    }
    if let Some(url) = args.attach.clone() {
        return attach(&args, &url);
    }
    let set = |name: &str| std::env::var_os(name).is_some();
    let daemon_args = daemon_args(
        args.snap.as_ref(),
        &args.daemon_args,
        TierEnv {
            cache: set("CAP"),
            pin: set("PIN") || set("PIN_GB") || set("REPIN"),
        },
    );
    let spec = DaemonSpec {
        program: args.daemon.clone().unwrap_or_else(default_daemon_path),
        args: daemon_args,
        telemetry: !args.no_telemetry,
        mux: args.mux,
    };
    let config = Config {
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        top_p: args.top_p,
        daemon_desc: spec.describe(),
        mux: args.mux,
        attach: None,
    };

    match run(
        spec,
        config,
        Duration::from_secs_f64(args.quit_grace.clamp(0.0, 600.0)),
    ) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("coli: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--attach URL`: the key from the flag or the environment, the server asked once before
/// the terminal is taken (exit 2 naming the URL and the HTTP status when it cannot be reached
/// or refuses the key), then the chat or `--check`.
fn attach(args: &Args, url: &str) -> ExitCode {
    if args.mux || args.snap.is_some() || args.daemon.is_some() || !args.daemon_args.is_empty() {
        eprintln!(
            "coli: --attach starts no daemon: --mux, --snap, --daemon and options after -- do not apply"
        );
        return ExitCode::from(2);
    }
    let key = args
        .api_key
        .clone()
        .or_else(|| std::env::var("COLIBRI_API_KEY").ok())
        .or_else(|| std::env::var("OPENAI_API_KEY").ok());
    let ep = match Endpoint::parse(url, key) {
        Ok(ep) => ep,
        Err(e) => {
            eprintln!("coli: {e}");
            return ExitCode::from(2);
        }
    };
    if args.check {
        let mut out = stdout();
        return match coli::attach::check(&ep, "Say hello.", 16, &mut out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("coli: {e}");
                ExitCode::from(2)
            }
        };
    }
    let model = match coli::attach::preflight(&ep) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("coli: {}", e.describe(&ep.url));
            return ExitCode::from(2);
        }
    };
    let config = Config {
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        top_p: args.top_p,
        daemon_desc: format!("attached to {} ({model})", ep.url),
        mux: false,
        attach: Some(ep.url.clone()),
    };
    match run_attached(ep, model, config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("coli: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Restores the terminal before a panic message is printed, or it is lost in the alternate
/// screen.
fn restore_on_panic() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore_terminal();
        default_hook(info);
    }));
}

/// The chat on a running server: the local mode's loop with [`Attached`] for the daemon.
fn run_attached(ep: Endpoint, model: String, config: Config) -> std::io::Result<()> {
    restore_on_panic();
    let (tx, rx) = crossbeam_channel::unbounded();
    let guard = TerminalGuard::enter()?;
    let mut terminal = Terminal::new(CrosstermBackend::new(stdout()))?;
    let size = terminal.size()?;
    let mut app = App::new(config, (size.width, size.height));
    spawn_terminal_threads(tx.clone())?;
    let mut ctl = Attached::start(ep, model, tx);
    let result = coli::run(&mut terminal, &rx, &mut app, &mut ctl);
    ctl.close();
    drop(terminal);
    drop(guard);
    result.map(|_| ())
}

/// Runs the chat; the exit status is 1 when the daemon never became ready (said on stderr
/// once the terminal is back, with its last stderr lines), else 0.
fn run(spec: DaemonSpec, config: Config, grace: Duration) -> std::io::Result<u8> {
    restore_on_panic();

    let (tx, rx) = crossbeam_channel::unbounded();
    let guard = TerminalGuard::enter()?;
    let mut terminal = Terminal::new(CrosstermBackend::new(stdout()))?;
    let size = terminal.size()?;
    let mut app = App::new(config, (size.width, size.height));
    spawn_terminal_threads(tx.clone())?;
    let mut sup = Supervisor::start(spec, tx);
    let result = coli::run(&mut terminal, &rx, &mut app, &mut sup);
    drop(terminal);
    drop(guard);
    if !sup.shutdown(grace) && sup.daemon.is_some() {
        eprintln!(
            "coli: colibri did not exit within {:.1}s of closing its input; killed it",
            grace.as_secs_f64()
        );
    }
    result?;
    let code = app.exit_status();
    if code != 0 {
        let why = match (&app.spawn_error, &app.exit) {
            (Some(e), _) => format!("could not start {}: {e}", spec_program(&app)),
            (None, Some(info)) => format!("colibri {info} before it was ready"),
            (None, None) => "colibri stopped before it was ready".to_string(),
        };
        eprintln!("coli: {why}");
        for line in app.last_log_lines(8) {
            eprintln!("  {line}");
        }
    }
    Ok(code)
}

/// The daemon as the title line names it (its program, first word of the description).
fn spec_program(app: &App) -> &str {
    app.config
        .daemon_desc
        .split(' ')
        .next()
        .unwrap_or("colibri")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    /// The demo gets `--cache 4` and a small re-pinned tier; a model, a user's `--cache` or
    /// `CAP`, a user's pin options or their variables keep theirs.
    #[test]
    fn the_demo_gets_a_small_cache_unless_the_user_chose() {
        let none = TierEnv::default();
        let demo = |user: &[&str]| {
            let mut v = os(user);
            v.extend(os(&["--cache", "4"]));
            v.extend(os(&DEMO_PIN));
            v.push("8".into());
            v
        };
        assert_eq!(daemon_args(None, &[], none), demo(&[]));
        assert_eq!(
            daemon_args(None, &os(&["--kv-slots", "2"]), none),
            demo(&["--kv-slots", "2"])
        );
        let mut pinned = os(&["--cache", "16"]);
        pinned.extend(os(&DEMO_PIN));
        pinned.push("8".into());
        assert_eq!(daemon_args(None, &os(&["--cache", "16"]), none), pinned);
        assert_eq!(
            daemon_args(None, &os(&["--cache=8", "--repin", "0"]), none),
            os(&["--cache=8", "--repin", "0"])
        );
        let env = TierEnv {
            cache: true,
            pin: true,
        };
        assert_eq!(daemon_args(None, &[], env), os(&[]));
        let snap = OsString::from("/m");
        assert_eq!(daemon_args(Some(&snap), &[], none), os(&["--snap", "/m"]));
        assert_eq!(
            daemon_args(None, &os(&["--snap", "/m"]), none),
            os(&["--snap", "/m"])
        );
    }

    /// `--mux`, or `COLI_MUX` set to a true-ish value (`COLI_MUX=0` is off). One test, so
    /// that nothing else reads the variable while it changes.
    #[test]
    fn mux_from_the_flag_or_the_environment() {
        std::env::remove_var("COLI_MUX");
        assert!(!Args::try_parse_from(["coli"]).unwrap().mux);
        assert!(Args::try_parse_from(["coli", "--mux"]).unwrap().mux);
        for (value, on) in [
            ("1", true),
            ("true", true),
            ("yes", true),
            ("on", true),
            ("0", false),
            ("false", false),
        ] {
            std::env::set_var("COLI_MUX", value);
            assert_eq!(
                Args::try_parse_from(["coli"]).unwrap().mux,
                on,
                "COLI_MUX={value}"
            );
        }
        std::env::remove_var("COLI_MUX");
    }
}
