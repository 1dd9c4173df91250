"""The likes pipeline: topic `likes` into the views of stream `likes` (who likes what, how many).

Run: `python -m pipelines.likes` (supervised by `make up`). Events follow the `likes` contract in
pipelines.events; the stream and its views are declared in sql/views/social.sql.
"""

import sys

from pipelines.consumer import main, views_pipeline
from pipelines.events import decode_like

PIPELINE = views_pipeline("likes", topic="likes", stream="likes", decode=decode_like)

if __name__ == "__main__":
    sys.exit(main(PIPELINE))
