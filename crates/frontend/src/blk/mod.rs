//! The vhost-user-blk frontend: virtio-blk requests from a guest, executed through the
//! host model and the card, completed when card time says so.

pub mod backend;
pub mod request;
pub mod serve;
pub mod target;

#[cfg(test)]
mod tests;
