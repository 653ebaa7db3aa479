"""The commands that drive the bundled engine itself, with no load: `bench generate`,
`bench serve` and `bench export-model`."""
