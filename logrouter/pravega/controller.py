"""logrouter's Pravega controller: the gRPC service official Pravega writers ask first.

A writer (e.g. the PyPI ``pravega`` client) creates its scope and stream here, asks for
the stream's current segments and where each segment lives (``getURI``: the segment
store, i.e. the ``pravega`` source), then appends over the segment-store protocol. The
server runs on grpcio's own thread pool, beside the reactor; the registry it shares with
the segment store is thread-safe.

Served rpcs (service ``io.pravega.controller.stream.api.grpc.v1.ControllerService``):
``createScope``, ``checkScopeExists``, ``listScopes``, ``createStream``,
``checkStreamExists``, ``listStreamsInScope``, ``getCurrentSegments``, ``getEpochSegments``, ``getURI``,
``isSegmentValid``, ``getSegmentsImmediatelyFollowing`` (and its deprecated misspelling
``getSegmentsImmediatlyFollowing``), ``getStreamConfiguration``,
``getControllerServerList`` and ``getDelegationToken``. Streams never seal or scale, so
successors are always empty and epoch 0 is the only epoch. Every other rpc of the service
(readers, transactions, scaling, truncation, deletion, key-value tables, …) is answered
``UNIMPLEMENTED`` with a message saying so, by one generic handler.

``createStream`` takes ``scalingPolicy.minNumSegments`` (at least 1) as a *fixed*
segment count whatever the scale type (a by-rate policy is not honoured: the stream
keeps its initial segments forever); retention policy and tags are ignored.

Listen addresses are Twisted server endpoint strings, mapped onto gRPC ports, parsed and
checked in ``controller_listen.py`` (which the config check imports; grpcio is imported
only here, when a ``pravega`` source starts its controller).
"""

from __future__ import annotations

import collections
import socket
import threading
from concurrent import futures
from typing import Any, Callable

import grpc
from twisted.logger import Logger

from . import controller_pb2 as pb
from . import controller_pb2_grpc as pb_grpc
from .controller_listen import Listen, check_controller_listen, key_and_certificate, parse_controller_listen  # noqa: F401
from .streams import MAX_SEGMENTS, StreamRegistry, segment_id, split_segment_id, valid_name

SERVICE = "io.pravega.controller.stream.api.grpc.v1.ControllerService"

log = Logger(namespace="logrouter.pravega.controller")


# -- the service --------------------------------------------------------------------


def _peer(context: grpc.ServicerContext) -> str:
    try:
        return context.peer() or "?"
    except Exception:
        return "?"


class _Servicer(pb_grpc.ControllerServiceServicer):
    def __init__(self, server: ControllerServer) -> None:
        self.server = server
        self.registry = server.registry

    # scopes

    def createScope(self, request: Any, context: grpc.ServicerContext) -> Any:
        status = pb.CreateScopeStatus
        if not valid_name(request.scope):
            return status(status=status.INVALID_SCOPE_NAME)
        try:
            created = self.registry.create_scope(request.scope)
        except OSError as e:
            log.error("pravega controller: cannot save scope {scope}: {error}", scope=request.scope, error=e)
            return status(status=status.FAILURE)
        if not created:
            return status(status=status.SCOPE_EXISTS)
        log.info("pravega controller: created scope {scope} (for {peer})", scope=request.scope, peer=_peer(context))
        return status(status=status.SUCCESS)

    def checkScopeExists(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.ExistsResponse(exists=self.registry.scope_exists(request.scope))

    def listScopes(self, request: Any, context: grpc.ServicerContext) -> Any:
        # One page holds every scope. The token is the last scope returned: the official
        # clients page until a page comes back empty, so a call with a token gets only
        # the scopes sorting after it (normally none).
        after = request.continuationToken.token
        page = [s for s in self.registry.scopes() if s > after] if after else self.registry.scopes()
        token = page[-1] if page else after
        return pb.ScopesResponse(scopes=page, continuationToken=pb.ContinuationToken(token=token))

    # streams

    def createStream(self, request: Any, context: grpc.ServicerContext) -> Any:
        status = pb.CreateStreamStatus
        scope, stream = request.streamInfo.scope, request.streamInfo.stream
        segments = max(1, request.scalingPolicy.minNumSegments)
        if segments > MAX_SEGMENTS:
            log.warn(
                "pravega controller: refused stream {scope}/{stream} with {segments} segments (at most {limit})",
                scope=scope,
                stream=stream,
                segments=segments,
                limit=MAX_SEGMENTS,
            )
            return status(status=status.FAILURE)
        try:
            result = self.registry.create_stream(scope, stream, segments)
        except OSError as e:
            log.error("pravega controller: cannot save stream {scope}/{stream}: {error}", scope=scope, stream=stream, error=e)
            return status(status=status.FAILURE)
        if result == "created":
            log.info(
                "pravega controller: created stream {scope}/{stream} with {segments} segment(s) (for {peer})",
                scope=scope,
                stream=stream,
                segments=segments,
                peer=_peer(context),
            )
            return status(status=status.SUCCESS)
        return status(
            status={"exists": status.STREAM_EXISTS, "no_scope": status.SCOPE_NOT_FOUND, "invalid": status.INVALID_STREAM_NAME}[
                result
            ]
        )

    def checkStreamExists(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.ExistsResponse(exists=self.registry.stream_exists(request.scope, request.stream))

    def listStreamsInScope(self, request: Any, context: grpc.ServicerContext) -> Any:
        # Paged like listScopes: everything in one page, then an empty one.
        response = pb.StreamsInScopeResponse
        scope = request.scope.scope
        after = request.continuationToken.token
        if not self.registry.scope_exists(scope):
            return response(status=response.SCOPE_NOT_FOUND, continuationToken=pb.ContinuationToken(token=after))
        names = self.registry.streams(scope)
        page = [s for s in names if s > after] if after else names
        return response(
            streams=[pb.StreamInfo(scope=scope, stream=name) for name in page],
            continuationToken=pb.ContinuationToken(token=page[-1] if page else after),
            status=response.SUCCESS,
        )

    def getStreamConfiguration(self, request: Any, context: grpc.ServicerContext) -> Any:
        count = self._require_stream(request.scope, request.stream, context)
        return pb.StreamConfig(
            streamInfo=pb.StreamInfo(scope=request.scope, stream=request.stream),
            scalingPolicy=pb.ScalingPolicy(scaleType=pb.ScalingPolicy.FIXED_NUM_SEGMENTS, minNumSegments=count),
        )

    # segments

    def getCurrentSegments(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._segment_ranges(request.scope, request.stream, context)

    def getEpochSegments(self, request: Any, context: grpc.ServicerContext) -> Any:
        info = request.streamInfo
        self._require_stream(info.scope, info.stream, context)
        epoch = self.registry.epoch(info.scope, info.stream)
        if request.epoch != epoch:
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"stream {info.scope}/{info.stream} has no epoch {request.epoch}: logrouter streams never scale, "
                f"the only epoch is {epoch}",
            )
        return self._segment_ranges(info.scope, info.stream, context)

    def getURI(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._require_segment(request, context)
        try:
            address = self.server.segment_store()
        except Exception as e:
            address = None
            log.warn("pravega controller: no segment store address: {error}", error=e)
        if not address:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the segment store is not listening yet")
        host, port = address
        return pb.NodeUri(endpoint=host, port=port)

    def isSegmentValid(self, request: Any, context: grpc.ServicerContext) -> Any:
        info = request.streamInfo
        return pb.SegmentValidityResponse(response=self.registry.has_segment_id(info.scope, info.stream, request.segmentId))

    def getSegmentsImmediatelyFollowing(self, request: Any, context: grpc.ServicerContext) -> Any:
        # Segments are never sealed, so none has successors.
        self._require_stream(request.streamInfo.scope, request.streamInfo.stream, context)
        return pb.SuccessorResponse(delegationToken=self.server.delegation_token)

    getSegmentsImmediatlyFollowing = getSegmentsImmediatelyFollowing  # deprecated spelling, same rpc

    # servers and tokens

    def getControllerServerList(self, request: Any, context: grpc.ServicerContext) -> Any:
        host, port = self.server.address()
        return pb.ServerResponse(nodeURI=[pb.NodeUri(endpoint=host, port=port)])

    def getDelegationToken(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.DelegationToken(delegationToken=self.server.delegation_token)

    # helpers

    def _require_stream(self, scope: str, stream: str, context: grpc.ServicerContext) -> int:
        count = self.registry.segment_count(scope, stream)
        if count is None:
            what = f"stream {scope}/{stream}" if self.registry.scope_exists(scope) else f"scope {scope!r} (stream {scope}/{stream})"
            context.abort(grpc.StatusCode.NOT_FOUND, f"no {what}")
        return count  # type: ignore[return-value]

    def _require_segment(self, request: Any, context: grpc.ServicerContext) -> None:
        info = request.streamInfo
        self._require_stream(info.scope, info.stream, context)
        if not self.registry.has_segment_id(info.scope, info.stream, request.segmentId):
            number, epoch = split_segment_id(request.segmentId)
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"stream {info.scope}/{info.stream} has no segment {number} in epoch {epoch} (id {request.segmentId})",
            )

    def _segment_ranges(self, scope: str, stream: str, context: grpc.ServicerContext) -> Any:
        self._require_stream(scope, stream, context)
        try:
            ranges = self.registry.segments(scope, stream)
            epoch = self.registry.epoch(scope, stream) or 0
        except KeyError:  # pragma: no cover - streams are never deleted
            context.abort(grpc.StatusCode.NOT_FOUND, f"no stream {scope}/{stream}")
        info = pb.StreamInfo(scope=scope, stream=stream)
        return pb.SegmentRanges(
            segmentRanges=[
                pb.SegmentRange(
                    segmentId=pb.SegmentId(streamInfo=info, segmentId=segment_id(r.number, epoch)),
                    minKey=r.min_key,
                    maxKey=r.max_key,
                )
                for r in ranges
            ],
            delegationToken=self.server.delegation_token,
        )


class _Unimplemented(grpc.GenericRpcHandler):
    """Every rpc of the service that ``_Servicer`` does not serve: ``UNIMPLEMENTED``.

    Consulted only after the generated handlers, so it sees exactly the rest (all
    controller rpcs are unary). Methods of other services get gRPC's own answer.
    """

    prefix = f"/{SERVICE}/"

    def __init__(self) -> None:
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def service(self, handler_call_details: Any) -> Any:
        method = handler_call_details.method or ""
        if not method.startswith(self.prefix):
            return None
        name = method[len(self.prefix) :]
        return grpc.unary_unary_rpc_method_handler(lambda request, context: self._refuse(name, context))

    def _refuse(self, name: str, context: grpc.ServicerContext) -> None:
        with self._lock:
            first = name not in self._warned and len(self._warned) < 100
            if first:
                self._warned.add(name)
        if first:
            log.warn("pravega controller: {peer} called unimplemented rpc {rpc}", peer=_peer(context), rpc=name)
        context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            f"{name} is not implemented: logrouter's Pravega controller serves writers only "
            f"(no readers, reader groups, transactions, scaling, truncation, deletion or key-value tables)",
        )


class _Recorder(grpc.ServerInterceptor):
    """Logs every rpc received (debug) and remembers the recent ones for inspection."""

    def __init__(self, server: ControllerServer) -> None:
        self.server = server

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        method = handler_call_details.method or ""
        name = method[len(_Unimplemented.prefix) :] if method.startswith(_Unimplemented.prefix) else method
        self.server._record(name)
        log.debug("pravega controller: rpc {rpc}", rpc=name)
        return continuation(handler_call_details)


# -- the server ---------------------------------------------------------------------


class ControllerServer:
    """The controller's gRPC server.

    ``segment_store()`` returns the ``(host, port)`` writers should append to (the
    answer of ``getURI``); it is called on gRPC threads and may return ``None`` (or
    raise) while the segment store is not listening, which answers ``UNAVAILABLE``.
    ``delegation_token`` goes to writers in ``getCurrentSegments``,
    ``getSegmentsImmediatelyFollowing`` and ``getDelegationToken``; they present it to
    the segment store in ``SetupAppend``. ``advertise_host`` is the host named by
    ``getControllerServerList`` (default: the listen interface, or this machine's name
    when listening on every address).
    """

    def __init__(
        self,
        registry: StreamRegistry,
        segment_store: Callable[[], tuple[str, int] | None],
        delegation_token: str = "",
        max_workers: int = 4,
        advertise_host: str | None = None,
    ) -> None:
        self.registry = registry
        self.segment_store = segment_store
        self.delegation_token = delegation_token
        self.max_workers = max_workers
        self.advertise_host = advertise_host
        self.port: int | None = None
        self.listen: Listen | None = None
        self._server: grpc.Server | None = None
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()
        self._recent: collections.deque[str] = collections.deque(maxlen=1000)

    def start(self, listen: str) -> int:
        """Bind ``listen`` (a Twisted endpoint string, see the module docstring) and serve;
        returns the bound port. ``ValueError`` for a bad address, ``OSError`` if the
        port cannot be bound."""
        if self._server is not None:
            raise RuntimeError("controller already started")
        parsed = parse_controller_listen(listen)
        credentials = grpc.ssl_server_credentials([key_and_certificate(parsed, listen)]) if parsed.kind == "ssl" else None
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="pravega-controller"),
            interceptors=[_Recorder(self)],
            # without this gRPC sets SO_REUSEPORT and a second server on a busy port "binds" too
            options=[("grpc.so_reuseport", 0)],
        )
        pb_grpc.add_ControllerServiceServicer_to_server(_Servicer(self), server)
        server.add_generic_rpc_handlers((_Unimplemented(),))
        address = parsed.grpc_address()
        try:
            if credentials is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, credentials)
        except RuntimeError as e:
            server.stop(None)
            raise OSError(f"pravega controller cannot listen on {listen!r} ({address}): {e}") from None
        if not port:
            server.stop(None)
            raise OSError(f"pravega controller cannot listen on {listen!r} ({address})")
        server.start()
        self._server, self.port, self.listen = server, port, parsed
        shown = Listen(parsed.kind, port, parsed.host).grpc_address()
        log.info("pravega controller listening on {address} ({kind})", address=shown, kind=parsed.kind)
        return port

    def stop(self, grace: float) -> None:
        """Stop serving, letting calls in progress finish for up to ``grace`` seconds.
        Blocks (call it in a thread); a no-op if not started or already stopped."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait()

    def address(self) -> tuple[str, int]:
        """The ``(host, port)`` this controller advertises."""
        if self.port is None or self.listen is None:
            raise RuntimeError("controller not started")
        host = self.advertise_host or self.listen.host
        if not host or host in ("0.0.0.0", "::"):
            host = socket.getfqdn()
        return host, self.port

    # rpc bookkeeping (any thread)

    def _record(self, name: str) -> None:
        with self._lock:
            if name in self._counts or len(self._counts) < 200:
                self._counts[name] += 1
            self._recent.append(name)

    def rpc_counts(self) -> dict[str, int]:
        """How many times each rpc was received (method names outside the service are
        given in full; at most 200 distinct names are counted)."""
        with self._lock:
            return dict(self._counts)

    def recent_rpcs(self) -> list[str]:
        """The last 1000 rpc names received, oldest first."""
        with self._lock:
            return list(self._recent)
