use std::ffi::OsString;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use colibri::cli::{Cli, Command};

/// Upstream launchers start the engine as `colibri [cap] [expert_bits] [dense_bits]` with
/// `SERVE=1` (or `PROMPT=...`) in the environment. Rewrite that into our subcommands.
fn upstream_style(args: Vec<OsString>) -> Vec<OsString> {
    let rest: Vec<String> = args
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let positional = rest.iter().all(|a| a.parse::<u32>().is_ok());
    let serve = std::env::var("SERVE").is_ok_and(|v| v == "1");
    let prompt = std::env::var("PROMPT")
        .ok()
        .or_else(|| std::env::var("COLI_PROMPT").ok());
    if !positional || (!serve && prompt.is_none()) {
        return args;
    }
    let mut out: Vec<OsString> = vec![args[0].clone()];
    if serve {
        out.push("serve".into());
    } else {
        out.extend([
            "run".into(),
            "--raw".into(),
            "--prompt".into(),
            prompt.unwrap_or_default().into(),
        ]);
    }
    // argv[1] = experts cached per layer (0 = the "auto" sentinel: our RAM-budget default),
    // argv[2] = expert bits (default 8), argv[3] = dense bits (default = expert bits).
    if let Some(cap) = rest.first().filter(|c| c.as_str() != "0") {
        out.extend(["--cache".into(), cap.into()]);
    }
    let ebits = rest.get(1).cloned().unwrap_or_else(|| "8".into());
    let dbits = rest.get(2).cloned().unwrap_or_else(|| ebits.clone());
    out.extend([
        "--expert-bits".into(),
        ebits.into(),
        "--dense-bits".into(),
        dbits.into(),
    ]);
    out
}

/// A refused value that came from the environment is named by its variable: clap names the
/// flag whichever source the value had, and a user who never typed `--max-tokens` looks for
/// it in vain when `NGEN` is what is wrong.
fn refuse(e: clap::Error, argv: &[OsString]) -> ExitCode {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        e.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        e.exit();
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        e.exit();
    };
    let flag = arg.split_whitespace().next().unwrap_or("").to_string();
    let typed = argv.iter().any(|a| {
        let a = a.to_string_lossy();
        a == flag || a.starts_with(&format!("{flag}="))
    });
    let var = Cli::command()
        .get_subcommands()
        .flat_map(|c| c.get_arguments().cloned().collect::<Vec<_>>())
        .find(|a| a.get_long().is_some_and(|l| format!("--{l}") == flag))
        .and_then(|a| a.get_env().map(|v| v.to_string_lossy().into_owned()))
        .filter(|v| std::env::var_os(v).is_some());
    match var {
        Some(var) if !typed => {
            let text = e.to_string().replacen(
                &format!("'{arg}'"),
                &format!("{var} (environment, for {flag})"),
                1,
            );
            colibri::elog_part!("{text}");
            ExitCode::from(2)
        }
        _ => e.exit(),
    }
}

fn main() -> ExitCode {
    let argv = upstream_style(std::env::args_os().collect());
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => return refuse(e, &argv),
    };
    // The pool is sized before anything runs on it (`rayon::scope` below starts it).
    if let Some(model) = cli.command.model_args() {
        model.init_threads();
    }
    // The command runs on a rayon worker (`scope` runs its body in the pool), so every
    // parallel region of a forward forks onto that worker's own deque for the other to take,
    // instead of being injected into the pool from outside at each of the many small matmuls.
    let result = rayon::scope(|_| match cli.command {
        Command::Serve(args) => colibri::serve::run(args),
        Command::Api(args) => colibri::api::run(args),
        Command::Run(args) => colibri::cmd::run::run(args),
        Command::Validate(args) => colibri::cmd::validate::run(args),
        Command::Bench(args) => colibri::cmd::bench::run(args),
        Command::Convert(args) => colibri::cmd::convert::run(args),
        Command::Score(args) => colibri::cmd::score::run(args),
        Command::Verify(args) => colibri::cmd::verify::run(args),
        Command::Info(args) => colibri::cmd::info::run(args),
        Command::Plan(args) => colibri::cmd::plan::run(args),
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            colibri::elog!("colibri: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
