"""`python -m app` is `app` (what the launchers run on every worker)."""

from app.cli import main

main()
