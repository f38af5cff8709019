//! The sandbox's users and groups, read from its own /etc/passwd and
//! /etc/group (the agent runs inside the sandbox, so these are the files
//! its processes see). No NSS: a sandbox's accounts are whatever its
//! template wrote into those two files.
//!
//! Used to start a process as a user (uid, gid, supplementary groups,
//! HOME/USER/LOGNAME) and to name the owner and group of files.

use std::collections::HashMap;

const PASSWD: &str = "/etc/passwd";
const GROUP: &str = "/etc/group";

/// A line of /etc/passwd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
}

/// The account named `name`.
pub fn by_name(name: &str) -> Option<Account> {
    accounts(&read(PASSWD)).find(|a| a.name == name)
}

/// The first account with this uid (as getpwuid answers).
pub fn by_uid(uid: u32) -> Option<Account> {
    accounts(&read(PASSWD)).find(|a| a.uid == uid)
}

/// The groups a process of `user` gets: its primary `gid` first, then
/// every group of /etc/group that lists `user` as a member (what
/// initgroups(3) computes).
pub fn groups_of(user: &str, gid: u32) -> Vec<u32> {
    groups_in(&read(GROUP), user, gid)
}

fn groups_in(group: &str, user: &str, gid: u32) -> Vec<u32> {
    let mut out = vec![gid];
    for line in group.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 4 {
            continue;
        }
        let Ok(g) = f[2].parse::<u32>() else { continue };
        if f[3].split(',').any(|m| m.trim() == user) && !out.contains(&g) {
            out.push(g);
        }
    }
    out
}

/// Owner and group names for file entries, each file read at most once
/// per request (a listing names thousands of entries).
#[derive(Debug, Default)]
pub struct Names {
    users: Option<HashMap<u32, String>>,
    groups: Option<HashMap<u32, String>>,
}

impl Names {
    pub fn user(&mut self, uid: u32) -> Option<String> {
        self.users
            .get_or_insert_with(|| ids(&read(PASSWD)))
            .get(&uid)
            .cloned()
    }

    pub fn group(&mut self, gid: u32) -> Option<String> {
        self.groups
            .get_or_insert_with(|| ids(&read(GROUP)))
            .get(&gid)
            .cloned()
    }
}

/// A missing or unreadable file has no accounts.
fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn accounts(text: &str) -> impl Iterator<Item = Account> + '_ {
    text.lines().filter_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 6 || f[0].is_empty() {
            return None;
        }
        Some(Account {
            name: f[0].to_string(),
            uid: f[2].parse().ok()?,
            gid: f[3].parse().ok()?,
            home: f[5].to_string(),
        })
    })
}

/// id → name from passwd or group lines (`name:x:id:...`); the first line
/// with an id wins, as with getpwuid/getgrgid.
fn ids(text: &str) -> HashMap<u32, String> {
    let mut map = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 3 || f[0].is_empty() {
            continue;
        }
        if let Ok(id) = f[2].parse() {
            map.entry(id).or_insert_with(|| f[0].to_string());
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_and_group_lines_parse() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nbad line\nuser:x:1000:1000::/home/user:/bin/sh\ntwin:x:1000:1000::/x:/bin/sh\n";
        let users: Vec<Account> = accounts(passwd).collect();
        assert_eq!(users.len(), 3);
        assert_eq!(users[1].home, "/home/user");
        let names = ids(passwd);
        assert_eq!(names[&1000], "user", "the first line with an id wins");
        let group = "root:x:0:\nsudo:x:27:user\nusers:x:100:a, user ,b\nuser:x:1000:\n";
        assert_eq!(ids(group)[&27], "sudo");
        assert_eq!(groups_in(group, "user", 1000), [1000, 27, 100]);
        assert_eq!(groups_in(group, "nobody", 65534), [65534]);
    }
}
