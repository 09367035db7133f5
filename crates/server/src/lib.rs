//! tokenmill-server: see ARCHITECTURE.md.
