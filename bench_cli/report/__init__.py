"""`bench report`: one self-contained HTML report per run or sweep (plotly), rebuilt from the
files on disk alone: a run's (run, steps), a sweep's (sweep) and what they share (page)."""
