use exec_server_proto::process::{OutputStream, ReadChunk, ReadResult};

use super::*;

fn out(seq: u64, text: &str) -> ProcessEvent {
    ProcessEvent::Output {
        seq,
        stream: OutputStream::Stdout,
        bytes: text.as_bytes().to_vec(),
    }
}

fn read(chunks: &[(u64, &str)], next_seq: u64, exited: bool, closed: bool) -> ReadResult {
    ReadResult {
        chunks: chunks
            .iter()
            .map(|(seq, text)| ReadChunk {
                seq: *seq,
                stream: OutputStream::Stdout,
                chunk: (*text).to_owned(),
            })
            .collect(),
        next_seq,
        exited,
        exit_code: exited.then_some(3),
        closed,
        failure: None,
        sandbox_denied: false,
    }
}

fn drained(reorder: &mut Reorder) -> Vec<ProcessEvent> {
    let mut events = Vec::new();
    reorder.drain(&mut events);
    events
}

/// The test decoder: chunks in these tests are plain text.
fn text(chunk: &str) -> Vec<u8> {
    chunk.as_bytes().to_vec()
}

#[test]
fn delivers_in_order_and_drops_duplicates() {
    let mut r = Reorder::new(8);
    assert_eq!(r.push(out(2, "b")), Pushed::Accepted);
    assert!(drained(&mut r).is_empty());
    assert_eq!(r.push(out(1, "a")), Pushed::Accepted);
    assert_eq!(drained(&mut r), vec![out(1, "a"), out(2, "b")]);
    assert_eq!(r.push(out(2, "b")), Pushed::Duplicate);
    assert_eq!(r.push(out(4, "d")), Pushed::Accepted);
    assert_eq!(r.push(out(4, "d")), Pushed::Duplicate);
    assert_eq!(r.cursor(), 2);
}

#[test]
fn asks_for_a_catch_up_when_a_gap_stays_open() {
    let mut r = Reorder::new(2);
    assert_eq!(r.push(out(2, "b")), Pushed::Accepted);
    assert_eq!(r.push(out(3, "c")), Pushed::Accepted);
    assert_eq!(r.push(out(4, "d")), Pushed::NeedsCatchUp);
    r.merge_read(read(&[(1, "a"), (2, "b")], 3, false, false), text);
    assert_eq!(
        drained(&mut r),
        vec![out(1, "a"), out(2, "b"), out(3, "c"), out(4, "d")]
    );
}

#[test]
fn catch_up_places_exit_and_close_in_the_unexplained_positions() {
    let mut r = Reorder::new(8);
    r.push(out(1, "a"));
    drained(&mut r);
    // While detached: output 2, exit 3, output 4 (a descendant), close 5.
    r.merge_read(read(&[(2, "b"), (4, "d")], 6, true, true), text);
    assert_eq!(
        drained(&mut r),
        vec![
            out(2, "b"),
            ProcessEvent::Exited {
                seq: 3,
                exit_code: 3,
                sandbox_denied: false
            },
            out(4, "d"),
            ProcessEvent::Closed { seq: 5 },
        ]
    );
}

#[test]
fn catch_up_overlapping_notifications_delivers_each_event_once() {
    let mut r = Reorder::new(8);
    // Notifications on the new connection overtake the catch-up answer.
    r.push(out(3, "c"));
    r.push(ProcessEvent::Exited {
        seq: 4,
        exit_code: 0,
        sandbox_denied: false,
    });
    assert!(drained(&mut r).is_empty());
    r.merge_read(read(&[(1, "a"), (2, "b"), (3, "c")], 5, true, false), text);
    let events = drained(&mut r);
    assert_eq!(events.len(), 4);
    assert_eq!(events[3].seq(), 4);
    r.push(ProcessEvent::Closed { seq: 5 });
    assert_eq!(drained(&mut r), vec![ProcessEvent::Closed { seq: 5 }]);
}

#[test]
fn evicted_output_is_reported_as_lost() {
    let mut r = Reorder::new(8);
    // Chunks 1-3 were evicted; 4 and 5 are retained; still running.
    r.merge_read(read(&[(4, "d"), (5, "e")], 6, false, false), text);
    assert_eq!(
        drained(&mut r),
        vec![
            ProcessEvent::OutputLost { first: 1, last: 3 },
            out(4, "d"),
            out(5, "e"),
        ]
    );
    assert_eq!(r.cursor(), 5);
}

#[test]
fn close_without_seq_goes_last() {
    let mut r = Reorder::new(8);
    r.push(out(1, "a"));
    r.push(out(3, "c"));
    r.push_close_without_seq();
    r.push(out(2, "b"));
    let events = drained(&mut r);
    assert_eq!(events.last(), Some(&ProcessEvent::Closed { seq: 4 }));
    assert_eq!(events.len(), 4);
}
