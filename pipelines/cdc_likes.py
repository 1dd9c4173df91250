"""The CDC likes pipeline: rows of `app.likes`, captured by Debezium, into the views of stream `likes`.

Run: `python -m pipelines.cdc_likes` (supervised by `make up`). It shares the `likes` stream with the
Kafka pipeline: both lock the stream rows they change, in key order, so they can run side by side.
"""

import sys

from pipelines.cdc import decode_app_like
from pipelines.consumer import main, views_pipeline

PIPELINE = views_pipeline("cdc_likes", topic="cdc.app.likes", stream="likes", decode=decode_app_like)

if __name__ == "__main__":
    sys.exit(main(PIPELINE))
