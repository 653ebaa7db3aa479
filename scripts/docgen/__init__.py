"""Reference pages generated from the code (`make docs`): each module turns one part of the
code into Markdown, so the docs cannot drift from what the code does."""
