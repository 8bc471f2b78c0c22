//! The EXT_CSD field table. (Being written: see the registers helper.)
