"""testkit.agent_clis's reading of strace's output: every IP destination, nothing else."""

# ruff: noqa: E501  (TRACE holds strace's own lines, verbatim)
from __future__ import annotations

from testkit.agent_clis import destinations

TRACE = r"""
101 connect(21, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("10.255.255.53")}, 16) = 0
101 connect(22, {sa_family=AF_INET, sin_port=htons(8000), sin_addr=inet_addr("127.0.0.1")}, 16) = -1 EINPROGRESS (Operation now in progress)
102 connect(9, {sa_family=AF_UNIX, sun_path="/var/run/nscd/socket"}, 110) = -1 ENOENT (No such file or directory)
102 sendto(48, "{\224\1\0\0\1\0\0\0\0\0\0\3api\6github\3com\0\0\1\0\1", 32, MSG_NOSIGNAL, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("10.0.0.2")}, 16) = 32
102 sendto(6, "\1", 1, MSG_NOSIGNAL, NULL, 0) = 1
103 connect(5, {sa_family=AF_INET6, sin6_port=htons(443), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "2606:4700::6810:1", &sin6_addr), sin6_scope_id=0}, 28) = -1 ENETUNREACH (Network is unreachable)
104 sendmsg(7, {msg_name={sa_family=AF_INET, sin_port=htons(123), sin_addr=inet_addr("192.0.2.9")}, msg_namelen=16, msg_iov=[{iov_base="x", iov_len=1}], msg_iovlen=1, msg_controllen=0, msg_flags=0}, 0) = 1
105 sendto(14, [{nlmsg_len=20, nlmsg_type=RTM_GETLINK}], 20, 0, {sa_family=AF_NETLINK, nl_pid=0, nl_groups=00000000}, 12) = 20
"""


def test_every_ip_destination_is_read_and_nothing_else() -> None:
    """TCP connects, UDP datagrams (sendto, sendmsg), IPv4 and IPv6 are destinations, in
    order; Unix sockets, netlink and datagrams on connected sockets are not."""
    assert destinations(TRACE) == [
        ("10.255.255.53", 53),
        ("127.0.0.1", 8000),
        ("10.0.0.2", 53),
        ("2606:4700::6810:1", 443),
        ("192.0.2.9", 123),
    ]
