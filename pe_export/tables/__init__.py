"""Position tables: find them in a frozen graph, compress them, and rebuild them in the exported file."""
