"""twistd plugin stub for ``twistd logrouter``; everything heavy lives in logrouter.tap."""

from twisted.application.service import ServiceMaker

logrouter = ServiceMaker(
    "logrouter",
    "logrouter.tap",
    "Log router: forward/Beats/... sources into a Parquet lake",
    "logrouter",
)
