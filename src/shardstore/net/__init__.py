"""The network transport between node processes, over Arrow Flight (``docs/design/transport.md``).

- :mod:`shardstore.net.wire`: the wire codec (values and exceptions to frames and back; pure);
- :mod:`shardstore.net.flight`: :class:`~shardstore.net.flight.FlightTransport`, the interface of
  :class:`shardstore.transport.Transport` over the network;
- :mod:`shardstore.net.security`: TLS, mutual TLS, the cluster secret and the bind check.

Nothing is imported here: ``import shardstore.net.wire`` does not load Flight.
"""
