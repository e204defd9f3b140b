vcl 4.1;
# Varnish 7.1 (Debian bookworm) in front of edge, the Durable Streams caching proxy.
# Needs vmod xkey (Debian: apt-get install varnish-modules). docs/cdn.md explains every rule and
# the failure each one prevents; tests/integration/test_cdn_*.py run this file as shipped (only
# the backend's port rewritten) in front of a real edge and origin.
#
# Rules this file owns:
# * Stored: only GET reads of a stream without credentials, for as long as the edge says a CDN may
#   keep them (Surrogate-Control max-age, else Cache-Control); an answer that states no lifetime
#   is never stored (Varnish's own default would keep it 120 s).
# * Passed (never stored, never collapsed): writes and every other method, HEAD, SSE, offset=now,
#   credentialed reads (Authorization, Cookie, a token parameter).
# * Stale only where the edge said so (stale-while-revalidate), never Varnish's 10 s default grace.
# * Purged by key: PURGE with xkey-purge from the purgers ACL removes every stored answer carrying
#   one of the keys (the edge's Surrogate-Key); a stream's key reaches all its instances.
# * A herd parked on one URL is released at once: the edge's long-poll answers (204s included)
#   are cacheable for about a second under their cursor URL, so Varnish wakes the whole waiting
#   list with a hit; backend timeouts sit above the edge's 30 s long-poll.
# * What Varnish delivers says what Varnish did (its own Cache-Status member after the edge's),
#   and nothing meant for the CDN (Surrogate-*, xkey, Cache-Tag, CDN-Cache-Control) leaks out.

import std;
import xkey;

backend edge {
    # The one line an operator edits: where edge listens for stream traffic.
    .host = "127.0.0.1"; .port = "8080";
    .connect_timeout = 5s;
    # A long-poll's headers come only when it ends: the edge's --long-poll-timeout (30 s) plus
    # slack, the same 75 s the edge itself allows the origin. Varnish's 60 s default would do, but
    # leaves no room for an edge configured longer.
    .first_byte_timeout = 75s;
    # SSE bodies pause between events; the edge sends a heartbeat every 15 s while idle.
    .between_bytes_timeout = 60s;
}

# Who may purge: the edge (--cdn-purge varnish=URL) runs beside Varnish by default. Add the
# edge replicas' addresses here when they run elsewhere.
acl purgers {
    "127.0.0.1";
    "::1";
}

sub vcl_recv {
    # Internal markers (below) are never taken from a client, nor passed on to the edge.
    unset req.http.X-Cdn-Fwd;
    unset req.http.X-Cdn-Accept-Encoding;
    unset req.http.X-Cdn-Status;
    unset req.http.X-Cdn-Purged;

    if (req.method == "PURGE") {
        if (client.ip !~ purgers) {
            return (synth(403, "Forbidden"));
        }
        if (!req.http.xkey-purge) {
            return (synth(400, "PURGE needs an xkey-purge header"));
        }
        # A hard purge: a soft purge would leave the old bytes servable from grace.
        set req.http.X-Cdn-Purged = xkey.purge(req.http.xkey-purge);
        return (synth(200, "Purged " + req.http.X-Cdn-Purged));
    }

    call vcl_req_host;
    if (req.method == "PRI") {
        return (synth(405));
    }

    # Writes and anything else that is not a read go to the edge as they are (RFC 9111 §4.4:
    # a write invalidates; the edge purges what it must).
    if (req.method != "GET" && req.method != "HEAD") {
        set req.http.X-Cdn-Fwd = "method";
        return (pass);
    }
    # HEAD: a miss would be fetched as a GET and later HEADs answered from it, so a capped GET
    # answer would report the read cap as the stream's tail. The edge answers HEAD itself, cheaply.
    if (req.method == "HEAD") {
        set req.http.X-Cdn-Fwd = "bypass";
        return (pass);
    }
    # SSE: one long response per viewer that a cache cannot share; streamed through, never
    # buffered (pass delivers as the edge writes). The edge rotates connections
    # (--sse-max-seconds); the longer send timeout lets an edge configured never to rotate
    # keep its viewers past Varnish's 600 s default.
    if (req.url ~ "[?&]live=sse(&|$)" || req.http.Accept ~ "(?i)text/event-stream") {
        set req.http.X-Cdn-Fwd = "bypass";
        set sess.send_timeout = 86400s;
        return (pass);
    }
    # offset=now names a different position every time.
    if (req.url ~ "[?&]offset=now(&|$)") {
        set req.http.X-Cdn-Fwd = "bypass";
        return (pass);
    }
    # Credentialed reads are the credential's own: passed, so no other client is ever served a
    # copy (and the edge answers them private anyway). A token parameter is a credential too
    # (edge --auth jwt reads it from browsers' EventSource).
    if (req.http.Authorization || req.http.Cookie || req.url ~ "[?&]token=") {
        set req.http.X-Cdn-Fwd = "bypass";
        return (pass);
    }
    return (hash);
}

sub vcl_hash {
    # The official clients do not sort their query parameters; two orders are one answer.
    # The URL travels to the edge as the client sent it.
    hash_data(std.querysort(req.url));
    if (req.http.host) {
        hash_data(req.http.host);
    } else {
        hash_data(server.ip);
    }
    # The representation is part of the key. Varnish rewrites a cacheable request's
    # Accept-Encoding to "gzip" (or removes it) before this point, ignores the edge's
    # Vary: Accept-Encoding, asks the backend for gzip whatever the client takes and un-gzips
    # for identity clients, weakening the edge's ETag (W/"...:gzip") so revalidations stop
    # matching. So gzip and identity clients each get their own copy, and vcl_backend_fetch
    # asks the edge for exactly the representation the copy is for.
    if (req.http.Accept-Encoding == "gzip") {
        set req.http.X-Cdn-Accept-Encoding = "gzip";
    } else {
        set req.http.X-Cdn-Accept-Encoding = "identity";
    }
    hash_data(req.http.X-Cdn-Accept-Encoding);
    return (lookup);
}

sub vcl_backend_fetch {
    if (!bereq.uncacheable) {
        if (bereq.http.X-Cdn-Accept-Encoding == "gzip") {
            set bereq.http.Accept-Encoding = "gzip";
        } elsif (bereq.http.X-Cdn-Accept-Encoding) {
            unset bereq.http.Accept-Encoding;
        }
    }
    unset bereq.http.X-Cdn-Accept-Encoding;
    unset bereq.http.X-Cdn-Fwd;
    if (bereq.method == "GET") {
        unset bereq.body;
    }
    return (fetch);
}

sub vcl_backend_response {
    if (bereq.uncacheable) {
        return (deliver);
    }
    # An edge error is never stored. During a background refresh of a copy the edge allowed to
    # be served stale, keep serving that copy (stale-if-error within the stale window).
    if (beresp.status >= 500) {
        if (bereq.is_bgfetch) {
            return (abandon);
        }
        call edge_uncacheable;
        return (deliver);
    }
    # Only stream reads and their conditional answers; 404/410 only as the edge says below
    # (it says no-store: a stream created just after a miss must be readable at once).
    if (beresp.status != 200 && beresp.status != 204 && beresp.status != 304 &&
        beresp.status != 404 && beresp.status != 410) {
        call edge_uncacheable;
        return (deliver);
    }
    # private: the answer is one credential's; a shared cache must not keep it (RFC 9111 §5.2.2.7),
    # whatever the CDN lifetime says.
    if (beresp.http.Cache-Control ~ "(?i)(^|[\s,])private") {
        call edge_uncacheable;
        return (deliver);
    }
    if (beresp.http.Set-Cookie || beresp.http.Vary == "*") {
        call edge_uncacheable;
        return (deliver);
    }
    # The CDN's lifetime: Surrogate-Control's max-age (the edge's word to Varnish and Fastly)
    # wins over Cache-Control (the browser's), as for Fastly; Varnish computed beresp.ttl (what
    # remains from now) from Cache-Control's s-maxage, else max-age, less the edge's Age, and the
    # same Age counts against Surrogate-Control's, so the time the edge held an answer (an
    # at-tail hit) never stacks with Varnish's. Only an explicit max-age makes a lifetime: an
    # answer without one (not the edge's: every answer of the edge states one; a balancer's
    # error page) is not stored, where Varnish would give it default_ttl (120 s).
    if (beresp.http.Surrogate-Control ~ "(?i)(^|[\s,])no-store") {
        call edge_uncacheable;
        return (deliver);
    }
    if (beresp.http.Surrogate-Control ~ "(?i)(^|[\s,])max-age=\d+") {
        set beresp.ttl = std.duration(regsub(beresp.http.Surrogate-Control,
            "(?i)^(?:.*[\s,])?max-age=(\d+).*$", "\1") + "s", 0s) - beresp.age;
    } elsif (beresp.http.Cache-Control ~ "(?i)(^|[\s,])(no-store|no-cache)" ||
             beresp.http.Cache-Control !~ "(?i)(^|[\s,])(s-maxage|max-age)=\d+") {
        call edge_uncacheable;
        return (deliver);
    }
    if (beresp.ttl <= 0s) {
        call edge_uncacheable;
        return (deliver);
    }
    # Stale only where the edge allows it: its stale-while-revalidate (closed ranges), never
    # Varnish's default grace (10 s), which served at-tail answers seconds after newer bytes.
    set beresp.grace = 0s;
    if (beresp.http.Surrogate-Control ~ "(?i)(^|[\s,])stale-while-revalidate=\d+") {
        set beresp.grace = std.duration(regsub(beresp.http.Surrogate-Control,
            "(?i)^(?:.*[\s,])?stale-while-revalidate=(\d+).*$", "\1") + "s", 0s);
    } elsif (beresp.http.Cache-Control ~ "(?i)(^|[\s,])stale-while-revalidate=\d+") {
        set beresp.grace = std.duration(regsub(beresp.http.Cache-Control,
            "(?i)^(?:.*[\s,])?stale-while-revalidate=(\d+).*$", "\1") + "s", 0s);
    }
    # The purge keys: xkey indexes the xkey header; the edge sends Surrogate-Key (Fastly's name).
    if (beresp.http.Surrogate-Key && !beresp.http.xkey) {
        set beresp.http.xkey = beresp.http.Surrogate-Key;
    }
    return (deliver);
}

# Not stored. Hit-for-miss rather than hit-for-pass: the next request for this URL goes to the
# edge without queueing behind another, and may still store its answer if that one is cacheable
# (a 404 followed by a create). Short, so a URL whose answers turn cacheable soon collapses again.
sub edge_uncacheable {
    set beresp.ttl = 10s;
    set beresp.grace = 0s;
    set beresp.uncacheable = true;
}

sub vcl_backend_error {
    set beresp.http.Cache-Control = "no-store";
    set beresp.ttl = 0s;
    set beresp.grace = 0s;
}

sub vcl_deliver {
    # RFC 9211: each cache adds its own member after those of the caches behind it; a stored
    # answer keeps the edge's member of the time it was stored, so Varnish says what it did now.
    if (obj.uncacheable) {
        if (req.http.X-Cdn-Fwd) {
            set req.http.X-Cdn-Status = "varnish; fwd=" + req.http.X-Cdn-Fwd;
        } else {
            set req.http.X-Cdn-Status = "varnish; fwd=uri-miss";
        }
    } elsif (obj.hits > 0 && obj.ttl >= 0s) {
        set req.http.X-Cdn-Status = "varnish; hit; ttl=" + std.integer(duration=obj.ttl, fallback=0);
    } elsif (obj.hits > 0) {
        # Served stale (within stale-while-revalidate): RFC 9211's ttl goes negative. The
        # conversion truncates towards zero, so a copy 0.3 s stale would say 0, as if fresh.
        set req.http.X-Cdn-Status = "varnish; hit; ttl=" + (std.integer(duration=obj.ttl, fallback=0) - 1);
    } else {
        set req.http.X-Cdn-Status = "varnish; fwd=uri-miss; stored";
    }
    if (resp.http.Cache-Status) {
        set resp.http.Cache-Status = resp.http.Cache-Status + ", " + req.http.X-Cdn-Status;
    } else {
        set resp.http.Cache-Status = req.http.X-Cdn-Status;
    }
    # Meant for this tier only: the CDN lifetime and the purge keys.
    unset resp.http.Surrogate-Control;
    unset resp.http.CDN-Cache-Control;
    unset resp.http.Surrogate-Key;
    unset resp.http.Cache-Tag;
    unset resp.http.xkey;
    return (deliver);
}

sub vcl_synth {
    # Varnish's own answers (purges, errors) are nobody's to keep.
    set resp.http.Cache-Control = "no-store";
    if (req.method == "PURGE") {
        set resp.http.Content-Type = "text/plain; charset=utf-8";
        set resp.body = resp.reason + {"
"};
        return (deliver);
    }
}
