use crate::common;
use common::*;

#[test]
fn set_and_get_through_walrus() {
    let v = Valkey::start();
    let w = Walrus::build().upstream(&v.addr()).start();
    let mut c = Raw::connect(&w.addr);
    assert_eq!(c.cmd(&["SET", "k", "v"]), b"+OK\r\n");
    assert_eq!(c.cmd(&["GET", "k"]), b"$1\r\nv\r\n");
}
