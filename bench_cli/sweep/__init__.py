"""`bench sweep`: one load list against a grid of settings, a fresh server per point (runner,
given the command's options as one value: options), the grid (grid), a point's runs (point,
serve_cmd), the load axis (rates, search), a point's row (row) and what is printed and drawn
of them (table, verdict, pareto)."""
