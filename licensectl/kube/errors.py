"""The Kubernetes API's answers as exception types: the one place that maps an HTTP status to a meaning.

A call site says `except NotFound:` or `except Conflict:` instead of comparing `e.status` with a
number, so what a status means is written once (kopf's `APIError` family has the same shape).
`ApiException(status, reason)` itself returns the subclass for a status that has one: the client,
the raw-JSON reader and an in-memory fake that raises `ApiException(404)` all produce a `NotFound`,
and nothing outside this module picks a class by number. The body is never carried: a failed Secret
write may echo the object back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar


class ApiException(Exception):
    """A non-2xx answer (or a request that could not be made, status 0): status, reason, headers."""

    STATUS: ClassVar[int | None] = None
    _BY_STATUS: ClassVar[dict[int, type[ApiException]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.STATUS is not None:
            ApiException._BY_STATUS[cls.STATUS] = cls

    def __new__(cls, status: int = 0, reason: str | None = None,
                headers: Mapping[str, str] | None = None) -> ApiException:
        if cls is ApiException:
            cls = ApiException._BY_STATUS.get(status, ApiException)
        return super().__new__(cls)

    def __init__(self, status: int = 0, reason: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(f"({status}) {reason or ''}".strip())
        self.status = status
        self.reason = reason or ""
        self.headers = headers

    def __reduce__(self) -> tuple[Any, ...]:
        return (ApiException, (self.status, self.reason, self.headers))


class Unauthorized(ApiException):
    """401: the credentials were refused."""

    STATUS = 401


class Forbidden(ApiException):
    """403: RBAC (or an admission policy) refused the verb."""

    STATUS = 403


class NotFound(ApiException):
    """404: the object (or its namespace, or the API) is not there."""

    STATUS = 404


class Conflict(ApiException):
    """409: the object already exists, or the resourceVersion sent is no longer current."""

    STATUS = 409


class Gone(ApiException):
    """410: the resourceVersion (or continue token) asked for has been compacted away."""

    STATUS = 410


class Invalid(ApiException):
    """422: the object failed validation."""

    STATUS = 422


class TooManyRequests(ApiException):
    """429: throttled (API priority and fairness, or an eviction a PodDisruptionBudget refuses)."""

    STATUS = 429


class ServiceUnavailable(ApiException):
    """503: the server (or an aggregated API behind it) cannot answer now."""

    STATUS = 503


def is_status(e: BaseException, *types: type[ApiException]) -> bool:
    """Whether `e` is one of `types`; also true for another client's exception carrying the same status
    (kubernetes-asyncio's, raised by the test kit's generated clients)."""
    if isinstance(e, types):
        return True
    status = getattr(e, "status", None)
    return isinstance(status, int) and any(status == t.STATUS for t in types)
