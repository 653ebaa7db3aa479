from bench_cli.app import app

app(prog_name="bench")
