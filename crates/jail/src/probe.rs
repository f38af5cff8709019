//! (being written by the doctor work) What this host offers.
