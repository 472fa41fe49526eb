//! `runcell tools --format openai|anthropic|gemini|mcp`: the tool definitions, ready to paste
//! into a function-calling request.

use std::process::ExitCode;

use runcell_engine::tools::{definitions_json, ToolFormat};

#[derive(Debug, clap::Args)]
pub struct ToolsArgs {
    /// The request format: openai (Chat Completions `tools`), anthropic (Messages `tools`),
    /// gemini (`functionDeclarations`) or mcp (`tools/list`).
    #[arg(long, default_value = "openai", value_parser = parse_format)]
    format: ToolFormat,
}

fn parse_format(s: &str) -> Result<ToolFormat, String> {
    s.parse()
}

pub fn tools(args: ToolsArgs) -> anyhow::Result<ExitCode> {
    println!(
        "{}",
        serde_json::to_string_pretty(&definitions_json(args.format))?
    );
    Ok(ExitCode::SUCCESS)
}
