"""Which hosts a sandboxed command may reach: domain rules, host normalisation and the decision.

This module enforces the network allow/deny lists, sans-IO: no sockets, no DNS, no threads. The
egress proxy asks `decide()` about every CONNECT / SOCKS5 / plain-HTTP request, and the settings
validator calls `DomainRule.parse()` on every entry of `allowedDomains` / `deniedDomains`, so a
rule means the same thing when it is written and when it is enforced.

Pattern shapes (the Codex conventions):

- ``example.com``     exactly that host;
- ``*.example.com``   its subdomains at any depth, but not ``example.com`` itself;
- ``**.example.com``  ``example.com`` and its subdomains;
- ``10.1.2.3``, ``::1``, ``10.0.0.0/8``, ``fd00::/8``  IP literals and networks;
- any of these with ``:port`` (``[::1]:8080`` for IPv6) to limit the rule to one port.

Why the host is normalised before anything is compared: a rule is only as strong as the
spellings it catches. ``http://2130706433/``, ``http://0x7f.1/`` and ``http://[::ffff:127.0.0.1]/``
all reach 127.0.0.1, so IPv4 literals are read the way browsers and ``inet_aton`` read them (the
WHATWG URL rules: 1-4 parts, hex ``0x``, octal leading ``0``) and IPv4-mapped IPv6 addresses
become the IPv4 address. A name whose last label is a number must be such an IPv4 literal or it is
refused, so ``1.2.3.999`` can never slip through as a "name" that no IP rule looks at.

Trade-offs written here:

- IDNA uses the standard library's IDNA 2003 codec. Where IDNA 2003 and IDNA 2008 disagree
  (``ß``, ``ς``, ZWJ, ZWNJ are the "deviation" characters) the two standards name *different*
  domains, so text containing them is refused rather than silently mapped to one of them; write
  the ``xn--`` form instead.
- Wildcards over a public suffix are refused using a short built-in list, not the full Public
  Suffix List: no dependency and no download, at the price of missing rarer suffixes. The list
  also names a few hosting suffixes where every subdomain belongs to a different stranger
  (``github.io``, ``herokuapp.com``…), because ``*.github.io`` is an exfiltration channel.
- An IPv6 network inside ``::ffff:0:0/96`` is stored as the IPv4 network it denotes (hosts are
  normalised the same way); a wider IPv6 network does not match IPv4 hosts.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Sequence, Union

__all__ = [
    "DomainRule",
    "Decision",
    "IPAddress",
    "PUBLIC_SUFFIXES",
    "RULE_KINDS",
    "address_kind",
    "decide",
    "normalize_host",
    "parse_ip",
]

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

#: The rule kinds, in the words used by the settings help.
RULE_KINDS = frozenset({"exact", "subdomains", "domain", "ip", "cidr"})

#: Two-label public suffixes (and shared-hosting suffixes) a wildcard may not cover. Deliberately
#: short: single-label bases (``*.com``) are refused by their label count, so this only has to
#: catch the common second-level registries and the platforms where anyone can get a subdomain.
PUBLIC_SUFFIXES = frozenset(
    {
        # Country-code second-level registries.
        "co.uk", "org.uk", "ac.uk", "gov.uk", "me.uk", "ltd.uk", "plc.uk",
        "com.au", "net.au", "org.au", "edu.au", "gov.au",
        "co.jp", "ne.jp", "or.jp", "ac.jp", "go.jp",
        "co.nz", "org.nz", "co.za", "co.in", "co.kr", "co.il", "co.id",
        "com.br", "com.cn", "com.mx", "com.tw", "com.sg", "com.tr", "com.hk", "com.ar",
        # Shared hosting: every subdomain has a different owner.
        "github.io", "gitlab.io", "herokuapp.com", "vercel.app", "netlify.app",
        "pages.dev", "workers.dev", "web.app", "firebaseapp.com", "appspot.com",
        "blogspot.com", "azurewebsites.net", "cloudfront.net", "ngrok.io", "ngrok-free.app",
    }
)

# Characters where IDNA 2003 (the stdlib codec) and IDNA 2008 / UTS 46 pick different domains.
_IDNA_DEVIATIONS = frozenset("\u00df\u03c2\u200c\u200d")
# The dots IDNA treats as label separators.
_IDNA_DOTS = re.compile("[\u002e\u3002\uff0e\uff61]")
# A label after IDNA: letters, digits, hyphen, and underscore (seen in real hostnames).
_LABEL = re.compile(r"[a-z0-9_-]{1,63}", re.ASCII)
# "Ends in a number" per the WHATWG URL standard: such a host must be an IPv4 literal.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*", re.ASCII)
_DECIMAL = re.compile(r"[0-9]+", re.ASCII)
_PORT = re.compile(r"[0-9]+", re.ASCII)

_MAPPED_V4 = ipaddress.IPv6Network("::ffff:0:0/96")


def _ipv4_number(part: str) -> int | None:
    """One part of a legacy IPv4 literal (decimal, ``0x`` hex, leading-``0`` octal) or None."""
    if part.startswith("0x"):
        digits = part[2:]
        if digits == "":
            return 0
        return int(digits, 16) if re.fullmatch(r"[0-9a-f]+", digits, re.ASCII) else None
    if len(part) > 1 and part.startswith("0"):
        return int(part, 8) if re.fullmatch(r"[0-7]+", part, re.ASCII) else None
    return int(part) if _DECIMAL.fullmatch(part) else None


def _parse_ipv4_literal(host: str) -> ipaddress.IPv4Address | None:
    """Read ``host`` the way browsers do (WHATWG IPv4 parser); None if it is not one."""
    parts = host.split(".")
    if len(parts) > 4 or len(host) > 253:
        return None
    numbers = [_ipv4_number(part) for part in parts]
    if any(n is None for n in numbers):
        return None
    *leading, last = numbers
    if any(n > 255 for n in leading) or last >= 256 ** (5 - len(numbers)):
        return None
    value = last
    for index, n in enumerate(leading):
        value += n << (8 * (3 - index))
    return ipaddress.IPv4Address(value)


def _unmap(ip: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address as the IPv4 address it reaches; anything else unchanged."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _parse_ipv6_literal(host: str, original: str) -> ipaddress.IPv6Address:
    """``host`` (brackets already removed) as an IPv6 address, or ValueError naming the problem."""
    if "%" in host:
        raise ValueError(f"{original!r}: IPv6 zone ids ('%eth0') are not supported")
    try:
        return ipaddress.IPv6Address(host)
    except ValueError:
        raise ValueError(f"{original!r} is not a valid IPv6 address or host name") from None


def _normalize(host: str) -> tuple[str, IPAddress | None]:
    """The normalised text of ``host`` and, for an IP literal, its address (unmapped)."""
    if not isinstance(host, str):
        raise TypeError(f"a host must be text, not {type(host).__name__}")
    original = host
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if ":" not in host:
            raise ValueError(f"{original!r}: square brackets are only for IPv6 addresses")
    if not host:
        raise ValueError("the host name is empty")
    if ":" in host:
        ip = _unmap(_parse_ipv6_literal(host, original))
        return str(ip), ip

    host = host.lower()
    if not host.isascii():
        if _IDNA_DEVIATIONS.intersection(host):
            raise ValueError(
                f"{original!r} contains a character (ß, ς, ZWJ or ZWNJ) that IDNA 2003 and "
                "IDNA 2008 map to different domains; write the 'xn--' form of the name instead"
            )
        labels_before = len(_IDNA_DOTS.split(host))
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise ValueError(
                f"{original!r} is not a valid internationalised host name ({exc})"
            ) from None
        if len(host.split(".")) != labels_before:
            raise ValueError(f"{original!r} contains a character that IDNA turns into a dot")
        host = host.lower()
    if host.endswith("."):
        host = host[:-1]
    if not host:
        raise ValueError(f"{original!r} is not a host name")

    labels = host.split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        ip4 = _parse_ipv4_literal(host)
        if ip4 is None:
            raise ValueError(
                f"{original!r} is not a valid IPv4 address (a host name cannot end in a number)"
            )
        return str(ip4), ip4
    if len(host) > 253:
        raise ValueError(f"{original!r} is longer than the 253 characters a host name may have")
    for label in labels:
        if not label:
            raise ValueError(
                f"{original!r} has an empty label (two dots in a row, or a leading dot)"
            )
        if len(label) > 63:
            raise ValueError(f"{original!r} has a label longer than 63 characters")
        if not _LABEL.fullmatch(label):
            bad = next(ch for ch in label if not _LABEL.fullmatch(ch))
            raise ValueError(f"{original!r} contains {bad!r}, which a host name cannot contain")
    return host, None


def normalize_host(host: str) -> str:
    """The canonical spelling of ``host``, the one every rule is compared against.

    Lowercase, one trailing dot removed, IDNA to ASCII (``bücher.de`` → ``xn--bcher-kva.de``),
    brackets around IPv6 removed. IP literals are canonicalised: ``2130706433``, ``0x7f.1``,
    ``0177.0.0.1`` and ``127.1`` all become ``127.0.0.1``; IPv6 is compressed; an IPv4-mapped
    IPv6 address becomes its IPv4 address. Raises ValueError, with the reason, for an empty or
    invalid host (bad characters, a label over 63 or a name over 253 characters).
    """
    return _normalize(host)[0]


def parse_ip(host: str) -> IPAddress | None:
    """The IP address ``host`` spells after normalisation, or None when it is a name.

    Raises ValueError when ``host`` is neither a valid name nor a valid IP literal.
    """
    return _normalize(host)[1]


def _split_port(text: str) -> tuple[str, int | None, bool]:
    """``text`` as (host part, port or None, whether the host was in square brackets)."""
    if text.startswith("["):
        close = text.find("]")
        if close == -1:
            raise ValueError(f"{text!r} opens '[' but never closes it")
        host, rest = text[1:close], text[close + 1:]
        if rest == "":
            return host, None, True
        if not rest.startswith(":"):
            raise ValueError(f"{text!r}: only ':port' may follow ']'")
        return host, _parse_port(rest[1:], text), True
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, _parse_port(port, text), False
    # No colon, or several: a bare IPv6 address / network, which cannot carry a port.
    return text, None, False


def _parse_port(port: str, text: str) -> int:
    if port == "":
        raise ValueError(f"{text!r} ends in ':' without a port number")
    if not _PORT.fullmatch(port):
        raise ValueError(f"{text!r}: the port must be a number from 1 to 65535, not {port!r}")
    number = int(port) if len(port) <= 5 else 0
    if not 1 <= number <= 65535:
        raise ValueError(f"{text!r}: the port must be from 1 to 65535, not {port}")
    return number


def _parse_network(host: str, text: str) -> IPNetwork:
    """``address/prefix`` as a network (host bits cleared), or ValueError."""
    address, _, prefix = host.partition("/")
    if ":" in address:
        ip: IPAddress = _parse_ipv6_literal(address, text)
    else:
        try:
            _, ip4 = _normalize(address)
        except ValueError:
            ip4 = None
        if ip4 is None:
            raise ValueError(
                f"{text!r} contains a path; a rule names a host (such as 'example.com'), "
                "not a URL"
            )
        ip = ip4
    if not _DECIMAL.fullmatch(prefix) or len(prefix) > 3:
        raise ValueError(f"{text!r}: the network prefix length must be a number, not {prefix!r}")
    try:
        network = ipaddress.ip_network((ip, int(prefix)), strict=False)
    except ValueError:
        raise ValueError(
            f"{text!r}: the prefix length must be at most {ip.max_prefixlen} for this address"
        ) from None
    if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(_MAPPED_V4):
        network = ipaddress.IPv4Network(
            (int(network.network_address) & 0xFFFFFFFF, network.prefixlen - 96)
        )
    if network.prefixlen == 0:
        raise ValueError(f"{text!r} would allow every address; name a smaller network")
    return network


def _wildcard_base(host: str, text: str) -> tuple[str, str]:
    """(kind, normalised base) of a ``*.x`` or ``**.x`` host, or ValueError."""
    if host in ("*", "**"):
        raise ValueError(f"{text!r} would allow every host; name a domain such as '*.example.com'")
    if host.startswith("**."):
        kind, base = "domain", host[3:]
    elif host.startswith("*."):
        kind, base = "subdomains", host[2:]
    else:
        base = ""
        kind = ""
    if not base or "*" in base:
        raise ValueError(
            f"{text!r}: a wildcard may only be the whole first label, as in '*.example.com' "
            "(subdomains) or '**.example.com' (the domain and its subdomains)"
        )
    base, ip = _normalize(base)
    if ip is not None:
        raise ValueError(
            f"{text!r}: wildcards apply to names, not IP addresses; use a network such as "
            "'10.0.0.0/8'"
        )
    if "." not in base:
        raise ValueError(
            f"{text!r} would allow every host under '.{base}'; name a domain such as "
            f"'*.example.{base}'"
        )
    if base in PUBLIC_SUFFIXES:
        raise ValueError(
            f"{text!r} would allow every site under the public suffix '{base}', each owned by "
            "someone else; name the domain itself"
        )
    return kind, base


@dataclass(frozen=True)
class DomainRule:
    """One entry of an allowed or denied list: a host pattern and an optional port.

    Build it with `DomainRule.parse`; ``pattern`` is the normalised text that ``parse`` reads
    back to an equal rule, and is what gets written to settings.
    """

    pattern: str
    kind: str
    host: str
    port: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in RULE_KINDS:
            raise ValueError(f"unknown domain rule kind {self.kind!r}")

    def __str__(self) -> str:
        return self.pattern

    @classmethod
    def parse(cls, text: str) -> "DomainRule":
        """Read a rule as a user writes it; raises ValueError with a reason a user understands."""
        if not isinstance(text, str):
            raise ValueError(f"a domain rule must be text, not {type(text).__name__} ({text!r})")
        if text == "":
            raise ValueError("a domain rule cannot be empty")
        if any(ch.isspace() for ch in text):
            raise ValueError(
                f"{text!r} contains whitespace; write the host alone, e.g. 'example.com'"
            )
        if "://" in text:
            raise ValueError(
                f"{text!r} is a URL; write only the host, e.g. 'example.com' or 'example.com:443'"
            )
        if "@" in text:
            raise ValueError(f"{text!r} contains user info ('@'); write only the host")

        host, port, bracketed = _split_port(text)
        if bracketed and ":" not in host:
            raise ValueError(f"{text!r}: square brackets are only for IPv6 addresses")
        if "/" in host:
            network = _parse_network(host, text)
            return cls._build("cidr", str(network), port, network.version == 6)
        if "*" in host:
            kind, base = _wildcard_base(host, text)
            prefix = "**." if kind == "domain" else "*."
            return cls(pattern=prefix + base + _port_suffix(port), kind=kind, host=base, port=port)
        try:
            name, ip = _normalize(host)
        except ValueError as exc:
            if host == text:
                raise
            raise ValueError(f"{text!r}: {exc}") from None
        if ip is not None:
            return cls._build("ip", name, port, ip.version == 6)
        return cls(pattern=name + _port_suffix(port), kind="exact", host=name, port=port)

    @classmethod
    def _build(cls, kind: str, host: str, port: int | None, ipv6: bool) -> "DomainRule":
        if port is not None and ipv6:
            pattern = f"[{host}]:{port}"
        else:
            pattern = host + _port_suffix(port)
        return cls(pattern=pattern, kind=kind, host=host, port=port)

    def matches(self, host: str, port: int) -> bool:
        """Whether a connection to ``host``:``port`` falls under this rule.

        ``host`` is normalised first, so every spelling of an address or name matches alike;
        a host that is not valid matches nothing.
        """
        if self.port is not None and port != self.port:
            return False
        try:
            name, ip = _normalize(host)
        except ValueError:
            return False
        if self.kind == "exact":
            return ip is None and name == self.host
        if self.kind == "subdomains":
            return ip is None and name.endswith("." + self.host)
        if self.kind == "domain":
            return ip is None and (name == self.host or name.endswith("." + self.host))
        if ip is None:
            return False
        if self.kind == "ip":
            return ip == ipaddress.ip_address(self.host)
        network = ipaddress.ip_network(self.host)
        return ip.version == network.version and ip in network


def _port_suffix(port: int | None) -> str:
    return "" if port is None else f":{port}"


@dataclass(frozen=True)
class Decision:
    """The verdict on one connection and what decided it.

    ``verdict`` is "allow", "deny" or "ask"; ``rule`` is the pattern that decided (None when no
    rule did), ``source`` where that rule came from (a settings file or "command line"), and
    ``reason`` one sentence for the person reading the prompt or the log.
    """

    verdict: str
    rule: str | None
    source: str | None
    reason: str


def _display(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def decide(
    host: str,
    port: int,
    allowed: Sequence[tuple[DomainRule, str]],
    denied: Sequence[tuple[DomainRule, str]],
) -> Decision:
    """Decide a connection to ``host``:``port`` from (rule, source) pairs.

    A matching denied rule wins over any allowed rule; among several matching rules the first
    in the given order is named. When neither list matches, the verdict is "ask". A host that
    is not valid is denied. Non-public addresses are not judged here (see `address_kind`).
    """
    try:
        name = normalize_host(host)
    except (TypeError, ValueError) as exc:
        return Decision("deny", None, None, f"The destination is not a valid host: {exc}.")
    where = _display(name, port)
    for rule, source in denied:
        if rule.matches(name, port):
            return Decision(
                "deny", rule.pattern, source,
                f"{where} matches the denied rule '{rule.pattern}' from {source}.",
            )
    for rule, source in allowed:
        if rule.matches(name, port):
            return Decision(
                "allow", rule.pattern, source,
                f"{where} matches the allowed rule '{rule.pattern}' from {source}.",
            )
    return Decision("ask", None, None, f"No rule allows or denies {where}.")


def _table(*rows: tuple[str, str]) -> tuple[tuple[IPNetwork, str], ...]:
    return tuple((ipaddress.ip_network(net), kind) for net, kind in rows)


# Most specific first: the first network containing the address names its kind. Written out
# rather than taken from ipaddress's is_private & co., whose lists change between Python versions.
_IPV4_KINDS = _table(
    ("169.254.169.254/32", "cloud metadata address"),  # AWS, GCP, Azure, OCI, DigitalOcean
    ("100.100.100.200/32", "cloud metadata address"),  # Alibaba Cloud
    ("168.63.129.16/32", "cloud metadata address"),  # Azure wire server
    ("0.0.0.0/8", "unspecified address"),  # "this network"; 0.0.0.0 reaches the local host
    ("127.0.0.0/8", "loopback address"),
    ("10.0.0.0/8", "private address"),
    ("172.16.0.0/12", "private address"),
    ("192.168.0.0/16", "private address"),
    ("100.64.0.0/10", "carrier-grade NAT address"),
    ("169.254.0.0/16", "link-local address"),
    ("192.0.0.0/24", "reserved address"),  # IETF protocol assignments
    ("192.0.2.0/24", "documentation address"),
    ("198.51.100.0/24", "documentation address"),
    ("203.0.113.0/24", "documentation address"),
    ("198.18.0.0/15", "benchmarking address"),
    ("224.0.0.0/4", "multicast address"),
    ("255.255.255.255/32", "broadcast address"),
    ("240.0.0.0/4", "reserved address"),
)
_IPV6_KINDS = _table(
    ("::/128", "unspecified address"),
    ("::1/128", "loopback address"),
    ("fd00:ec2::254/128", "cloud metadata address"),  # AWS over IPv6
    ("64:ff9b:1::/48", "private address"),  # local-use NAT64
    ("fc00::/7", "private address"),  # unique local
    ("fec0::/10", "private address"),  # deprecated site-local
    ("fe80::/10", "link-local address"),
    ("ff00::/8", "multicast address"),
    ("100::/64", "reserved address"),  # discard-only
    ("2001:db8::/32", "documentation address"),
    ("3fff::/20", "documentation address"),
    ("2000::/3", ""),  # global unicast: public unless an embedded IPv4 says otherwise
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")


def address_kind(ip: IPAddress) -> str | None:
    """What kind of non-public address ``ip`` is, e.g. "loopback address", or None if public.

    Kinds: cloud metadata, loopback, private, link-local, carrier-grade NAT, multicast,
    broadcast, unspecified, documentation, benchmarking and reserved addresses. IPv6 addresses
    that carry an IPv4 address (IPv4-mapped, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``) take
    the kind of the IPv4 address inside, so a non-public IPv4 address cannot be reached through
    its IPv6 spelling. IPv6 outside ``2000::/3`` and the listed ranges is reserved.
    """
    ip = _unmap(ip)
    if isinstance(ip, ipaddress.IPv4Address):
        return next((kind for net, kind in _IPV4_KINDS if ip in net), None)
    if ip in _NAT64:
        return address_kind(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip in _SIX_TO_FOUR:
        inner = address_kind(ipaddress.IPv4Address((int(ip) >> 80) & 0xFFFFFFFF))
        if inner is not None:
            return inner
    for net, kind in _IPV6_KINDS:
        if ip in net:
            return kind or None
    return "reserved address"


def check_address(host: str, port: int, ip: IPAddress, allowed: Sequence[tuple[DomainRule, str]],
                  mapped: bool = False, local_addresses: frozenset[str] = frozenset()) -> Decision | None:
    """After an allowed name resolved to ``ip``: None if the connection may go ahead, else a deny.

    Loopback, private, link-local, cloud-metadata, multicast, unspecified (…) addresses and this
    machine's own addresses are refused unless the address or a network containing it is itself
    an allowed rule: a public name must not become a way into the local network (DNS rebinding).
    A name the user mapped to an address (``network.hosts`` / ``--resolve``) is exempt for that
    name only: no DNS was involved and the user chose the address.
    """
    ip = _unmap(ip)
    text = str(ip)
    kind = address_kind(ip) or ("address of this machine" if text in local_addresses else None)
    if kind is None or mapped:
        return None
    for rule, source in allowed:
        if rule.kind in ("ip", "cidr") and rule.matches(text, port):
            return None
    return Decision(
        "deny", None, None,
        f"{_display(host, port)} resolves to {text}, a {kind}; only an explicit rule for that address "
        f"(e.g. --allow-domain {_display(text, port) if ':' not in text else text}) or a --resolve mapping reaches it.")
