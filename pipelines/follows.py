"""The follows pipeline: topic `follows` into the views of stream `follows` (following, followers).

Run: `python -m pipelines.follows` (supervised by `make up`). Events follow the `follows` contract in
pipelines.events; the stream and its views are declared in sql/views/social.sql.
"""

import sys

from pipelines.consumer import main, views_pipeline
from pipelines.events import decode_follow

PIPELINE = views_pipeline("follows", topic="follows", stream="follows", decode=decode_follow)

if __name__ == "__main__":
    sys.exit(main(PIPELINE))
