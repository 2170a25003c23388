//! `vnvme serve` across two processes over a real socket: region access limits and
//! broken framing (truncated messages, bad header sizes, unknown commands, posted writes).
//!
//! Every test starts its own server process and checks at the end that it is still
//! alive and serving.

mod common;

use std::io::Write;
use std::time::Duration;

use common::protocol::*;
use common::*;
use vfio_user::client::Client;
use vfio_user::proto::*;
use zerocopy::little_endian::U32;
use zerocopy::IntoBytes;

// ---- region access limits

#[test]
fn region_access_out_of_range_gets_error_replies_and_the_server_keeps_serving() {
    let mut server = Server::start();
    let mut c = server.raw_negotiated();
    let cases: Vec<(&str, RegionAccess)> = vec![
        ("offset at the end of config", access(REGION_CONFIG, 4096, 4)),
        ("offset far beyond config", access(REGION_CONFIG, 1 << 40, 4)),
        ("offset + count straddles the end", access(REGION_CONFIG, 4094, 4)),
        ("offset + count overflows", access(REGION_CONFIG, u64::MAX - 1, 4)),
        ("offset + count overflows (BAR0)", access(REGION_BAR0, u64::MAX, 8)),
        ("count 0", access(REGION_CONFIG, 0, 0)),
        ("count over 1 MiB", access(REGION_CONFIG, 0, (1 << 20) + 1)),
        ("count u32::MAX", access(REGION_BAR0, 0, u32::MAX)),
        ("absent region", access(1, 0, 4)),
        ("region 9", access(9, 0, 4)),
        ("region u32::MAX", access(u32::MAX, 0, 4)),
        ("BAR0 beyond its end", access(REGION_BAR0, 1 << 30, 4)),
        ("BAR4 beyond its end", access(REGION_BAR4, 1 << 20, 4)),
    ];
    let mut id = 100;
    for (what, a) in &cases {
        id += 1;
        let m = request(&mut c, id, READ, &[a.as_bytes()], &[]);
        assert!(is_error(&m) && m.header.error.get() != 0, "REGION_READ {what} was not refused");
        id += 1;
        // Writes carry as many data bytes as they can (never more than 64 KiB here),
        // so the payload-short case is covered too.
        let data = vec![0xa5u8; (a.count.get() as usize).min(64 << 10)];
        let m = request(&mut c, id, WRITE, &[a.as_bytes(), &data], &[]);
        assert!(is_error(&m) && m.header.error.get() != 0, "REGION_WRITE {what} was not refused");
    }
    // A BAR0 read of a size no register has is refused; such a write is dropped the way
    // hardware drops it (logged under vnvme::guest), with a normal reply.
    id += 1;
    expect_error(&mut c, id, READ, &[access(REGION_BAR0, 0x14, 3).as_bytes()], &[]);
    id += 1;
    let m = request(&mut c, id, WRITE, &[access(REGION_BAR0, 0x14, 3).as_bytes(), &[1, 0, 0]], &[]);
    assert!(!is_error(&m));
    id += 1;
    let m = request(&mut c, id, READ, &[access(REGION_BAR0, 0x14, 4).as_bytes()], &[]);
    assert_eq!(&m.payload[16..], &[0; 4], "CC unchanged by the 3-byte write");
    // A write whose payload is shorter than its count.
    id += 1;
    expect_error(&mut c, id, WRITE, &[access(REGION_CONFIG, 0x3c, 4).as_bytes(), &[1, 2]], &[]);
    // A write of more than 1 MiB really sent: refused, payload drained, stream intact.
    id += 1;
    let big = vec![0u8; (1 << 20) + 8];
    expect_error(&mut c, id, WRITE, &[access(REGION_BAR0, 0, big.len() as u32).as_bytes(), &big], &[]);
    // Short headers of the access itself.
    id += 1;
    expect_error(&mut c, id, READ, &[&[0u8; 12]], &[]);
    // The same connection still works, and the replies have QEMU's sizes.
    id += 1;
    let m = request(&mut c, id, READ, &[access(REGION_CONFIG, 0, 4).as_bytes()], &[]);
    assert!(!is_error(&m));
    assert_eq!(m.header.size.get(), 32 + 4);
    assert_eq!(&m.payload[16..], &0x0010_1b36u32.to_le_bytes());
    id += 1;
    let m = request(&mut c, id, WRITE, &[access(REGION_CONFIG, 0x3c, 1).as_bytes(), &[9]], &[]);
    assert!(!is_error(&m));
    assert_eq!(m.header.size.get(), 32, "REGION_WRITE reply is the 16-byte access without data");
    server.assert_alive();
    drop(c);
    still_serving(&mut server);
}

// ---- broken framing

#[test]
fn truncated_messages_then_close_leave_the_server_serving_the_next_client() {
    let mut server = Server::start();
    // Before VERSION: a header promising 1000 bytes, 100 sent.
    let mut s = server.stream();
    write_raw(&mut s, &raw_header(1, VERSION, 1000));
    write_raw(&mut s, &[0u8; 84]);
    drop(s);
    still_serving(&mut server);
    // After VERSION: a REGION_WRITE whose data never arrives.
    let c = server.raw_negotiated();
    let mut s = c.stream().try_clone().unwrap();
    drop(c);
    let mut m = raw_header(2, WRITE, 16 + 16 + 4096).to_vec();
    m.extend_from_slice(access(REGION_BAR0, 0x14, 4096).as_bytes());
    m.extend_from_slice(&[1u8; 100]);
    write_raw(&mut s, &m);
    drop(s);
    still_serving(&mut server);
    // Half a header.
    let mut s = server.stream();
    write_raw(&mut s, &raw_header(3, GET_INFO, 32)[..7]);
    drop(s);
    still_serving(&mut server);
    // A DMA_MAP whose payload is cut short.
    let c = server.raw_negotiated();
    let mut s = c.stream().try_clone().unwrap();
    drop(c);
    write_raw(&mut s, &raw_header(4, DMA_MAP, 48));
    write_raw(&mut s, &[0u8; 10]);
    drop(s);
    still_serving(&mut server);
    server.assert_alive();
}

#[test]
fn header_sizes_below_16_or_above_the_limit_drop_the_connection_and_the_server_survives() {
    let mut server = Server::start();
    for (negotiate, size) in [
        (false, 0u32),
        (true, 8),
        (true, 15),
        (true, (1 << 20) + 4097),
        (true, (2 << 20) + 1),
        (false, u32::MAX),
    ] {
        let mut s = if negotiate {
            let c = server.raw_negotiated();
            c.stream().try_clone().unwrap()
        } else {
            server.stream()
        };
        write_raw(&mut s, &raw_header(9, GET_INFO, size));
        // Whatever comes after must not be needed: the server must drop us now.
        let _ = s.write_all(&[0u8; 16]);
        assert!(closed_by_peer(&mut s), "header size {size}: connection not dropped");
        drop(s);
        still_serving(&mut server);
    }
    server.assert_alive();
}

#[test]
fn unknown_command_numbers_get_an_error_and_the_connection_stays_usable() {
    let mut server = Server::start();
    let mut c = server.raw_negotiated();
    let mut id = 0x4000;
    for cmd in [0u16, 11, 12, 14, 15, 16, 17, 18, 19, 99, 0x8000, 65535] {
        for payload_len in [0usize, 24, 4096] {
            id += 1;
            let errno = expect_error(&mut c, id, cmd, &[&vec![0x5au8; payload_len]], &[]);
            assert_ne!(errno, 0, "command {cmd}");
        }
        // The stream is still in step: a real command answers correctly.
        id += 1;
        let m = request(
            &mut c,
            id,
            GET_INFO,
            &[DeviceInfo { argsz: U32::new(16), ..Default::default() }.as_bytes()],
            &[],
        );
        assert!(!is_error(&m), "after command {cmd}");
        assert_eq!(Client::parse::<DeviceInfo>(&m.payload).unwrap().num_regions.get(), 9);
    }
    // A reply sent by the client (the server never asks anything) is ignored.
    c.send(header(0x4fff, GET_INFO, MsgFlags::REPLY), &[&[0u8; 16]], &[]).unwrap();
    // Unknown commands sent as posted (No_reply) get no reply at all.
    c.send(header(0x5000, 99, MsgFlags::COMMAND | MsgFlags::NO_REPLY), &[&[0u8; 8]], &[]).unwrap();
    let m = request(
        &mut c,
        0x5001,
        GET_INFO,
        &[DeviceInfo { argsz: U32::new(16), ..Default::default() }.as_bytes()],
        &[],
    );
    assert!(!is_error(&m));
    server.assert_alive();
}

#[test]
fn posted_writes_get_no_reply_and_are_ordered_before_a_later_read() {
    let mut server = Server::start();
    let mut c = server.raw_negotiated();
    let posted = MsgFlags::COMMAND | MsgFlags::NO_REPLY;
    // Latency timer (0x0d) is writable.
    c.send(header(0x100, WRITE, posted), &[access(REGION_CONFIG, 0x0d, 1).as_bytes(), &[0x42]], &[]).unwrap();
    // A posted write that fails is not answered either.
    c.send(header(0x101, WRITE, posted), &[access(REGION_CONFIG, 8192, 4).as_bytes(), &[0; 4]], &[]).unwrap();
    // A posted read-type command (meaningless) must not produce a reply either.
    c.send(header(0x102, GET_INFO, posted), &[DeviceInfo::default().as_bytes()], &[]).unwrap();
    c.send(header(0x103, READ, MsgFlags::COMMAND), &[access(REGION_CONFIG, 0x0c, 4).as_bytes()], &[])
        .unwrap();
    let m = c.recv().unwrap();
    assert_eq!(m.header.msg_id.get(), 0x103, "the first reply must answer the read, not a posted write");
    assert!(!is_error(&m));
    assert_eq!(m.payload[16 + 1], 0x42, "the posted write happened before the read");
    // Nothing else is waiting in the stream.
    c.stream().set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut probe = [0u8; 1];
    let r = std::io::Read::read(&mut c.stream().try_clone().unwrap(), &mut probe);
    assert!(r.is_err(), "unexpected extra bytes after the read's reply: {r:?}");
    server.assert_alive();
}
