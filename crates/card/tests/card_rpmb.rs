//! RPMB through the bus: the partition is selected with CMD6 PARTITION_CONFIG access 3
//! and every request and response travels as 512-byte frames through CMD23 + CMD25 and
//! CMD23 + CMD18 (facts §11.3–§11.5).
//!
//! Frames are built and taken apart with `emmc_test_support::rpmb`, at the fact sheet's
//! offsets (§11.3), and MACs are computed there with the `hmac` and `sha2` crates over the
//! bytes as they came off the bus, so neither the card's frame codec nor its MAC helper is
//! trusted by these tests. `public_codec_agrees_with_the_fact_sheet_layout` checks the
//! public codec separately.

mod common;

use common::Host;
use emmc_card::rpmb::{self, RpmbFrame};
use emmc_card::store::ImageStore;
use emmc_card::{r1, Card, CardState, Partition, PowerDown};
use emmc_test_support::rpmb::*;

/// CMD23 bit 31: reliable write (facts §1b), which RPMB writes carry.
const REL: u32 = 1 << 31;
/// A clean tran status: READY_FOR_DATA | tran << 9.
const TRAN: u32 = 0x0000_0900;

const KEY: [u8; 32] = *b"an RPMB key for the bus tests..!";
const OTHER_KEY: [u8; 32] = [0xA5; 32];

fn half(tag: u8) -> [u8; 256] {
    std::array::from_fn(|i| tag ^ (i as u8).wrapping_mul(13))
}

// ---- the bus sequences of facts §11.5

fn rpmb_host() -> Host {
    let mut h = Host::ready(common::model());
    h.select_partition(Partition::Rpmb);
    assert_eq!(h.card.current_partition(), Partition::Rpmb);
    h
}

/// CMD23(N | flags) + CMD25 + N frames; waits for programming to end.
fn send(h: &mut Host, frames: &[Frame], flags: u32) {
    send_at(h, frames, flags, 0);
}

/// `send` with `arg` as the CMD25 address (facts §11.5: ignored for RPMB).
fn send_at(h: &mut Host, frames: &[Frame], flags: u32, arg: u32) {
    assert_eq!(h.r1(23, frames.len() as u32 | flags), TRAN, "CMD23");
    assert_eq!(h.r1(25, arg), TRAN, "CMD25 in RPMB");
    assert_eq!(h.card.state(), CardState::Rcv);
    let bytes: Vec<u8> = frames.iter().flat_map(|f| f.0).collect();
    h.card
        .write_data(h.now, &bytes)
        .expect("RPMB frames accepted");
    h.wait_busy();
    assert_eq!(h.status(), TRAN, "status after the RPMB write transfer");
}

/// CMD23(N) + CMD18 + N frames, as they came off the bus.
fn receive(h: &mut Host, n: usize) -> Vec<Frame> {
    receive_at(h, n, 0)
}

/// `receive` with `arg` as the CMD18 address (facts §11.5: ignored for RPMB).
fn receive_at(h: &mut Host, n: usize, arg: u32) -> Vec<Frame> {
    assert_eq!(h.r1(23, n as u32), TRAN, "CMD23");
    assert_eq!(h.r1(18, arg), TRAN, "CMD18 in RPMB");
    let mut bytes = vec![0u8; n * FRAME];
    h.card
        .read_data(h.now, &mut bytes)
        .expect("RPMB frames delivered");
    assert_eq!(
        h.card.state(),
        CardState::Tran,
        "the read ends after N frames"
    );
    bytes
        .chunks_exact(FRAME)
        .map(|c| Frame(c.try_into().unwrap()))
        .collect()
}

fn result_read(h: &mut Host) -> Frame {
    send(h, &[Frame::request(REQ_RESULT)], 0);
    receive(h, 1).remove(0)
}

fn program_key(h: &mut Host, key: &[u8; 32]) -> Frame {
    send(h, &[Frame::request(REQ_KEY).with_key(key)], REL);
    result_read(h)
}

fn read_counter(h: &mut Host, nonce: [u8; 16]) -> Frame {
    send(h, &[Frame::request(REQ_COUNTER).with_nonce(&nonce)], 0);
    receive(h, 1).remove(0)
}

/// Authenticated write of `data` at `address`, signed with `key`; returns the result
/// read response.
fn auth_write(
    h: &mut Host,
    key: &[u8; 32],
    address: u16,
    counter: u32,
    data: &[[u8; 256]],
) -> Frame {
    let mut frames: Vec<Frame> = data
        .iter()
        .map(|d| {
            Frame::request(REQ_WRITE)
                .with_data(d)
                .with_counter(counter)
                .with_address(address)
                .with_block_count(data.len() as u16)
        })
        .collect();
    sign(key, &mut frames);
    send(h, &frames, REL);
    result_read(h)
}

fn auth_read(h: &mut Host, address: u16, nonce: [u8; 16], n: usize) -> Vec<Frame> {
    // mmc-utils leaves the request's block count 0 and lets CMD23 give the count (§11.5).
    let req = Frame::request(REQ_READ)
        .with_nonce(&nonce)
        .with_address(address);
    send(h, &[req], 0);
    receive(h, n)
}

fn nonce(tag: u8) -> [u8; 16] {
    std::array::from_fn(|i| tag.wrapping_add(i as u8 * 17))
}

/// A keyed card with `writes` successful one-frame writes at address 0.
fn keyed(writes: u32) -> Host {
    let mut h = rpmb_host();
    assert_eq!(program_key(&mut h, &KEY).result(), OK);
    for c in 0..writes {
        let r = auth_write(&mut h, &KEY, 0, c, &[half(c as u8)]);
        assert_eq!(r.result(), OK, "setup write {c}");
    }
    h
}

// ---- tests ----------------------------------------------------------------------------

#[test]
fn key_programming_then_result_read_reports_ok() {
    let mut h = rpmb_host();
    let r = program_key(&mut h, &KEY);
    assert_eq!(r.resp(), RESP_KEY, "response type");
    assert_eq!(r.result(), OK, "result");
    // The key is in use: the counter response is signed with it.
    let c = read_counter(&mut h, nonce(1));
    assert_eq!(c.result(), OK);
    assert_mac(&KEY, &[c], "counter response after key programming");
}

#[test]
fn second_key_programming_fails_and_keeps_the_first_key() {
    let mut h = rpmb_host();
    assert_eq!(program_key(&mut h, &KEY).result(), OK);
    let r = program_key(&mut h, &OTHER_KEY);
    assert_eq!(r.resp(), RESP_KEY);
    // Facts §11.4: one-time; a second attempt fails (general or write failure).
    assert!(
        matches!(r.result(), GENERAL_FAILURE | WRITE_FAILURE),
        "second key programming answered {:#06x}",
        r.result()
    );
    let c = read_counter(&mut h, nonce(2));
    assert_mac(&KEY, std::slice::from_ref(&c), "counter response");
    assert_ne!(c.mac(), mac_over(&OTHER_KEY, std::slice::from_ref(&c)));
}

#[test]
fn counter_read_echoes_the_nonce_with_a_mac_that_verifies() {
    let mut h = keyed(0);
    let n = nonce(0x3C);
    let c = read_counter(&mut h, n);
    assert_eq!(c.resp(), RESP_COUNTER);
    assert_eq!(c.result(), OK);
    assert_eq!(c.counter(), 0);
    assert_eq!(c.nonce(), n, "nonce echoed");
    assert_mac(&KEY, std::slice::from_ref(&c), "counter response");
    // A different nonce gives a different MAC (the nonce is covered).
    let c2 = read_counter(&mut h, nonce(0x3D));
    assert_eq!(c2.nonce(), nonce(0x3D));
    assert_mac(&KEY, std::slice::from_ref(&c2), "second counter response");
    assert_ne!(c.mac(), c2.mac());
}

#[test]
fn authenticated_writes_of_one_and_two_frames_read_back_with_verifying_macs() {
    let mut h = keyed(0);
    // One frame at half sector 0.
    let r = auth_write(&mut h, &KEY, 0, 0, &[half(0x11)]);
    assert_eq!(r.resp(), RESP_WRITE);
    assert_eq!(r.result(), OK);
    assert_eq!(r.counter(), 1, "counter incremented");
    assert_eq!(r.address(), 0);
    assert_mac(&KEY, std::slice::from_ref(&r), "write response");
    // Two frames at half sectors 6 and 7.
    let r = auth_write(&mut h, &KEY, 6, 1, &[half(0x21), half(0x22)]);
    assert_eq!((r.resp(), r.result(), r.counter()), (RESP_WRITE, OK, 2));
    assert_eq!(r.address(), 6);
    assert_mac(&KEY, std::slice::from_ref(&r), "two-frame write response");

    let n = nonce(0x40);
    let one = auth_read(&mut h, 0, n, 1);
    assert_eq!(one[0].resp(), RESP_READ);
    assert_eq!(one[0].result(), OK);
    assert_eq!(one[0].data(), &half(0x11)[..]);
    assert_eq!(one[0].nonce(), n);
    assert_eq!(one[0].address(), 0);
    assert_mac(&KEY, &one, "one-frame read");

    let n = nonce(0x41);
    let two = auth_read(&mut h, 6, n, 2);
    for (f, want) in two.iter().zip([half(0x21), half(0x22)]) {
        assert_eq!((f.resp(), f.result()), (RESP_READ, OK));
        assert_eq!(f.data(), &want[..]);
        assert_eq!(f.nonce(), n);
        assert_eq!(f.address(), 6);
        assert_eq!(f.block_count(), 2);
    }
    assert_mac(&KEY, &two, "two-frame read (MAC over both frames)");

    // The data sits where the address says: half sector k at byte 256·k of RPMB.
    let mut sectors = vec![0u8; 4 * 512];
    h.card.peek(Partition::Rpmb, 0, &mut sectors).unwrap();
    assert_eq!(&sectors[..256], &half(0x11)[..]);
    assert_eq!(&sectors[6 * 256..7 * 256], &half(0x21)[..]);
    assert_eq!(&sectors[7 * 256..8 * 256], &half(0x22)[..]);
    assert_eq!(read_counter(&mut h, nonce(9)).counter(), 2);
}

#[test]
fn bad_mac_is_authentication_failure_and_writes_nothing() {
    let mut h = keyed(1);
    let before = auth_read(&mut h, 0, nonce(1), 1)[0].data().to_vec();
    // Signed with the wrong key.
    let r = auth_write(&mut h, &OTHER_KEY, 0, 1, &[half(0xEE)]);
    assert_eq!(r.resp(), RESP_WRITE);
    assert_eq!(r.result(), AUTH_FAILURE);
    // Signed correctly, then one data byte altered.
    let mut frames = vec![Frame::request(REQ_WRITE)
        .with_data(&half(0xEE))
        .with_counter(1)
        .with_block_count(1)];
    sign(&KEY, &mut frames);
    frames[0].0[DATA] ^= 1;
    send(&mut h, &frames, REL);
    assert_eq!(result_read(&mut h).result(), AUTH_FAILURE);

    let after = auth_read(&mut h, 0, nonce(2), 1);
    assert_eq!(after[0].result(), OK);
    assert_eq!(after[0].data(), &before[..], "nothing was written");
    assert_mac(&KEY, &after, "read after refused writes");
    assert_eq!(
        read_counter(&mut h, nonce(3)).counter(),
        1,
        "counter unchanged"
    );
}

#[test]
fn counter_mismatch_is_counter_failure() {
    let mut h = keyed(2);
    for stale in [1u32, 3, 0xFFFF_0000] {
        let r = auth_write(&mut h, &KEY, 0, stale, &[half(0xEE)]);
        assert_eq!(r.resp(), RESP_WRITE);
        assert_eq!(r.result(), COUNTER_FAILURE, "counter field {stale}");
        assert_mac(&KEY, std::slice::from_ref(&r), "counter failure response");
    }
    assert_eq!(read_counter(&mut h, nonce(4)).counter(), 2);
    assert_eq!(
        auth_read(&mut h, 0, nonce(5), 1)[0].data(),
        &half(1)[..],
        "the last successful write's data is still there"
    );
}

#[test]
fn address_out_of_range_is_address_failure() {
    let mut h = keyed(0);
    let halves = (h.card.partition_sectors(Partition::Rpmb) * 2) as u16;
    assert_eq!(
        halves, 16384,
        "RPMB_SIZE_MULT 32 = 4 MiB = 16384 half sectors"
    );
    let r = auth_write(&mut h, &KEY, halves, 0, &[half(1)]);
    assert_eq!((r.resp(), r.result()), (RESP_WRITE, ADDRESS_FAILURE));
    let r = auth_write(&mut h, &KEY, halves - 1, 0, &[half(1), half(2)]);
    assert_eq!(
        r.result(),
        ADDRESS_FAILURE,
        "two frames from the last half sector"
    );
    let r = auth_write(&mut h, &KEY, 0xFFFF, 0, &[half(1), half(2)]);
    assert_eq!(r.result(), ADDRESS_FAILURE, "16-bit address wrap");
    assert_eq!(read_counter(&mut h, nonce(6)).counter(), 0);
    // Reads past the end fail the same way.
    let f = auth_read(&mut h, halves, nonce(7), 1);
    assert_eq!((f[0].resp(), f[0].result()), (RESP_READ, ADDRESS_FAILURE));
    // The last half sector itself is in range.
    let r = auth_write(&mut h, &KEY, halves - 1, 0, &[half(3)]);
    assert_eq!(r.result(), OK);
    assert_eq!(
        auth_read(&mut h, halves - 1, nonce(8), 1)[0].data(),
        &half(3)[..]
    );
}

#[test]
fn requests_before_key_programming_answer_key_not_programmed() {
    let mut h = rpmb_host();
    let c = read_counter(&mut h, nonce(1));
    assert_eq!((c.resp(), c.result()), (RESP_COUNTER, KEY_NOT_PROGRAMMED));
    let w = auth_write(&mut h, &KEY, 0, 0, &[half(9)]);
    assert_eq!((w.resp(), w.result()), (RESP_WRITE, KEY_NOT_PROGRAMMED));
    let r = auth_read(&mut h, 0, nonce(2), 1);
    assert_eq!(
        (r[0].resp(), r[0].result()),
        (RESP_READ, KEY_NOT_PROGRAMMED)
    );
    let mut sector = vec![0u8; 512];
    h.card.peek(Partition::Rpmb, 0, &mut sector).unwrap();
    assert!(
        sector.iter().all(|&b| b == 0),
        "the refused write wrote nothing"
    );
}

#[test]
fn single_block_and_unannounced_transfers_in_rpmb_get_error_and_no_data_phase() {
    // Facts §11.5 / §15: CMD17/CMD24, and reads/writes without CMD23, are invalid in the
    // RPMB partition; the card answers ERROR (R1 bit 19, type "r": in the response
    // itself) and starts no data phase.
    let mut h = keyed(1);
    for (index, label) in [
        (17u8, "CMD17"),
        (24, "CMD24"),
        (25, "CMD25 without CMD23"),
        (18, "CMD18 without CMD23"),
    ] {
        assert_eq!(h.r1(index, 0), TRAN | r1::ERROR, "{label}");
        assert_eq!(h.card.state(), CardState::Tran, "{label}: no data phase");
        assert!(
            h.card.write_data(h.now, &[0u8; 512]).is_err(),
            "{label}: card took data"
        );
        assert!(
            h.card.read_data(h.now, &mut [0u8; 512]).is_err(),
            "{label}: card sent data"
        );
        assert_eq!(h.status(), TRAN, "{label}: ERROR is cleared once read");
    }
    // Nothing happened to the RPMB state.
    let c = read_counter(&mut h, nonce(3));
    assert_eq!((c.result(), c.counter()), (OK, 1));
    assert_eq!(auth_read(&mut h, 0, nonce(4), 1)[0].data(), &half(0)[..]);
}

#[test]
fn key_and_counter_survive_a_sudden_power_cycle() {
    let mut h = keyed(3);
    h.card.power_cycle(h.now, PowerDown::Sudden);
    assert_eq!(h.card.state(), CardState::Idle);
    h.init();
    assert_eq!(
        h.card.current_partition(),
        Partition::User,
        "access resets to user"
    );
    h.select_partition(Partition::Rpmb);
    let c = read_counter(&mut h, nonce(5));
    assert_eq!((c.result(), c.counter()), (OK, 3));
    assert_mac(
        &KEY,
        std::slice::from_ref(&c),
        "counter response after power loss",
    );
    assert_eq!(auth_read(&mut h, 0, nonce(6), 1)[0].data(), &half(2)[..]);
    assert_ne!(
        program_key(&mut h, &OTHER_KEY).result(),
        OK,
        "key still programmed"
    );
    assert_eq!(auth_write(&mut h, &KEY, 1, 3, &[half(7)]).counter(), 4);
}

/// A card on a fresh image file, brought to tran with RPMB selected.
fn image_host(path: &std::path::Path, create: bool) -> Host {
    let model = common::model();
    let layout = Card::layout_for(&model);
    let store = if create {
        ImageStore::create(path, layout, &model.name).unwrap()
    } else {
        ImageStore::open(path, layout, &model.name).unwrap()
    };
    let mut h = Host {
        card: Card::new(model, Box::new(store)).unwrap(),
        now: 0,
    };
    h.init();
    h.select_partition(Partition::Rpmb);
    h
}

/// After reopening: counter `counter`, signed with KEY, and `data` at half sector 5.
fn check_reopened(h: &mut Host, counter: u32, data: [u8; 256]) {
    let c = read_counter(h, nonce(7));
    assert_eq!((c.result(), c.counter()), (OK, counter));
    assert_mac(
        &KEY,
        std::slice::from_ref(&c),
        "counter response after reopening",
    );
    let d = auth_read(h, 5, nonce(8), 1);
    assert_eq!(d[0].data(), &data[..]);
    assert_mac(&KEY, &d, "read after reopening");
    assert_ne!(
        program_key(h, &OTHER_KEY).result(),
        OK,
        "key still programmed"
    );
}

#[test]
fn key_counter_and_data_survive_a_sudden_power_off_and_reopening_the_image() {
    // The strongest form of "reloaded from its store": a new card on the same image file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("card.img");
    let mut h = image_host(&path, true);
    assert_eq!(program_key(&mut h, &KEY).result(), OK);
    assert_eq!(auth_write(&mut h, &KEY, 5, 0, &[half(0x55)]).result(), OK);
    h.card.power_off(h.now, PowerDown::Sudden);
    drop(h);
    check_reopened(&mut image_host(&path, false), 1, half(0x55));
}

#[test]
fn acknowledged_rpmb_writes_are_in_the_image_before_any_shutdown() {
    // A result read that says OK means the key, counter and data are durable (facts
    // §11.5: authenticated writes are reliable writes). If the emulator process dies
    // right after, with no power-off path run at all, a new card on the image must still
    // have them.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("card.img");
    let mut h = image_host(&path, true);
    assert_eq!(program_key(&mut h, &KEY).result(), OK);
    assert_eq!(auth_write(&mut h, &KEY, 5, 0, &[half(0x55)]).result(), OK);
    assert_eq!(auth_write(&mut h, &KEY, 5, 1, &[half(0x66)]).result(), OK);
    drop(h);
    check_reopened(&mut image_host(&path, false), 2, half(0x66));
}

#[test]
fn cmd25_and_cmd18_address_arguments_are_ignored_in_rpmb() {
    // Facts §11.5: the frame's address field says where; the command argument does not.
    let mut h = keyed(0);
    let mut frames = vec![Frame::request(REQ_WRITE)
        .with_data(&half(0x77))
        .with_address(3)
        .with_block_count(1)];
    sign(&KEY, &mut frames);
    send_at(&mut h, &frames, REL, 0xFFFF_FFFF);
    send_at(&mut h, &[Frame::request(REQ_RESULT)], 0, 0x1234);
    let r = receive_at(&mut h, 1, 0x8000_0000).remove(0);
    assert_eq!((r.resp(), r.result(), r.counter()), (RESP_WRITE, OK, 1));
    let req = Frame::request(REQ_READ)
        .with_nonce(&nonce(1))
        .with_address(3);
    send_at(&mut h, &[req], 0, 3);
    let d = receive_at(&mut h, 1, 0xFFFF_FFFF);
    assert_eq!((d[0].result(), d[0].address()), (OK, 3));
    assert_eq!(d[0].data(), &half(0x77)[..]);
    assert_mac(&KEY, &d, "read with a stray CMD18 argument");
}

#[test]
fn public_codec_agrees_with_the_fact_sheet_layout() {
    let mut f = RpmbFrame::with_type(REQ_WRITE);
    f.key_mac = [0x01; 32];
    f.data = half(0x02);
    f.nonce = nonce(0x03);
    f.write_counter = 0x0405_0607;
    f.address = 0x0809;
    f.block_count = 0x0A0B;
    f.result = 0x0C0D;
    let b = Frame(f.to_bytes());
    assert!(b.0[..KEY_MAC].iter().all(|&x| x == 0), "stuff bytes");
    assert_eq!(b.mac(), [0x01; 32]);
    assert_eq!(b.data(), &half(0x02)[..]);
    assert_eq!(b.nonce(), nonce(0x03));
    assert_eq!(b.counter(), 0x0405_0607);
    assert_eq!(b.address(), 0x0809);
    assert_eq!(b.block_count(), 0x0A0B);
    assert_eq!(b.result(), 0x0C0D);
    assert_eq!(b.resp(), REQ_WRITE);
    assert_eq!(
        rpmb::rpmb_mac(&KEY, &b.0),
        mac_over(&KEY, std::slice::from_ref(&b))
    );
}
