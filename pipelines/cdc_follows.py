"""The CDC follows pipeline: rows of `app.follows`, captured by Debezium, into stream `follows`.

Run: `python -m pipelines.cdc_follows` (supervised by `make up`).
"""

import sys

from pipelines.cdc import decode_app_follow
from pipelines.consumer import main, views_pipeline

PIPELINE = views_pipeline("cdc_follows", topic="cdc.app.follows", stream="follows", decode=decode_app_follow)

if __name__ == "__main__":
    sys.exit(main(PIPELINE))
