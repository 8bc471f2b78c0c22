//! The `vhost-user-emmc` command line.

fn main() {
    env_logger::init();
}
