//! tokenmill-engine: see ARCHITECTURE.md.
