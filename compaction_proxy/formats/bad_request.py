"""Bad client input: raised while a request is read and parsed, answered with a 4xx in the
caller's API error shape before anything is forwarded (``http.errors``)."""

from __future__ import annotations


class BadRequest(Exception):
    """Bad client input, answered before anything is forwarded."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        error_type: str = "invalid_request_error",
        close_connection: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.error_type = error_type
        # The body was not read to its end (too large, or its framing broken): the connection
        # closes after the answer rather than be kept for a next request.
        self.close_connection = close_connection
