"""The error every codec raises for input it cannot decode."""


class DecodeError(Exception):
    """Input a codec cannot decode. ``fatal`` means the connection cannot continue."""

    def __init__(self, reason: str, fatal: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.fatal = fatal
