"""``python -m vecaccel``: the same as the ``vecaccel`` command."""

from __future__ import annotations

from vecaccel.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
