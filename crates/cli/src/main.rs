//! The `tokenmill` binary: `serve`, `generate`, `bench serve`, `triage`.

fn main() -> anyhow::Result<()> {
    Ok(())
}
