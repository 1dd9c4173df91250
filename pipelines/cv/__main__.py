"""`python -m pipelines.cv`: the `streamviews` command under its older name (see pipelines.cv.cli).

    python -m pipelines.cv define --file my_views.sql
    python -m pipelines.cv list
    python -m pipelines.cv drop-view social.x     # the same as: drop --view social.x

Every command of `streamviews` works here too; `drop-view` and `drop-stream` remain as aliases.
"""

import sys

from pipelines.cv.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m pipelines.cv"))
