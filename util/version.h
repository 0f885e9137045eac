/* version: the daemon's and the protocol's version numbers. */
#ifndef VERSION_H
#define VERSION_H

#define KVSTASH_VERSION "0.1.0"
#define KVSTASH_PROTOCOL_VERSION 1

#endif
