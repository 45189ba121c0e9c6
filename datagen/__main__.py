"""``python -m datagen ...``: the ``datagen`` console script (:func:`datagen.cli.main`)."""

import sys

from datagen.cli import main

sys.exit(main())
