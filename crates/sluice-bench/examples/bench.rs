//! Stand-alone driver of the bench engine until the CLI wires `sluice bench`:
//! `cargo run --release -p sluice-bench --example bench -- --target 127.0.0.1:4420 --nqn NQN ...`

use clap::Parser;
use sluice_bench::BenchArgs;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let json = cli.bench.json;
    let r = sluice_bench::run(cli.bench)?;
    if json {
        println!("{}", r.to_json());
    } else {
        r.print_table();
    }
    Ok(())
}
