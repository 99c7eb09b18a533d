// Preloaded into Azurite (NODE_OPTIONS=--require) when it keeps its data on disk: the
// table service answers a write only once the write is on disk.
//
// Why: Azurite's table store is LokiJS in memory, saved to disk by a 5 s autosave timer, so
// `kill -9` of Azurite lost every write of the last seconds that it had already answered
// (27 accepted orders in issue #15's probe). Azurite has no option for it (3.37: the
// interval is a constant in LokiTableMetadataStore), hence this patch.
//
// How: a journal beside the database file. Before a write to an entity is answered (or a
// transaction, after its last operation), the entity's new image, or its absence, is
// appended to the journal. Each save of the database (still Loki's 5 s autosave) starts
// a new journal file and, once the save is on disk, deletes the ones it covers: the save
// serialises the database before it starts writing, so every line of those files is in
// it. On start, after Azurite has loaded the database, the journal files left are
// replayed in order (an image replaces the entity, an absence removes it), saved, and
// deleted. So a write costs one small append, whatever the size of the database. Rare
// writes (a table created or deleted, an ACL, service properties) save the whole
// database before they are answered instead. Saves write a temporary file and rename it,
// so a kill mid-save leaves the previous file. No fsync: this survives the death of the
// Azurite process, not of the machine.
"use strict";

const fs = require("fs");
const path = require("path");

const ENTITY_WRITES = {
  // method: (args) => [table, account, partitionKey, rowKey, batchId]
  insertTableEntity: (a) => [a[1], a[2], a[3].PartitionKey, a[3].RowKey, a[4]],
  insertOrUpdateTableEntity: (a) => [a[1], a[2], a[3].PartitionKey, a[3].RowKey, a[5]],
  insertOrMergeTableEntity: (a) => [a[1], a[2], a[3].PartitionKey, a[3].RowKey, a[5]],
  updateTableEntity: (a) => [a[1], a[2], a[3].PartitionKey, a[3].RowKey, a[5]],
  mergeTableEntity: (a) => [a[1], a[2], a[3].PartitionKey, a[3].RowKey, a[5]],
  deleteTableEntity: (a) => [a[1], a[2], a[3], a[4], a[6]],
};
const RARE_WRITES = ["createTable", "deleteTable", "setTableACL", "setServiceProperties"];

function azuriteSource() {
  // argv[1] is Azurite's entry script (dist/src/azurite.js or dist/src/table/main.js).
  const script = fs.realpathSync(process.argv[1]);
  const marker = `${path.sep}dist${path.sep}src${path.sep}`;
  const at = script.lastIndexOf(marker);
  if (at < 0) {
    throw new Error(`azurite_durable: ${script} is not an Azurite entry script`);
  }
  return script.slice(0, at + marker.length);
}

function save(store) {
  return new Promise((resolve, reject) => {
    store.db.saveDatabase((err) => (err ? reject(err) : resolve()));
  });
}

function onDisk(store) {
  return store.db.persistenceMethod === "fs";
}

function clean(doc) {
  const copy = { ...doc };
  delete copy.$loki;
  delete copy.meta;
  return copy;
}

/** The journal files of one database: `<db>.journal.<n>`, n rising. */
class Journal {
  constructor(dbPath) {
    this.dbPath = dbPath;
    this.left = this.files();
    this.number = this.left.reduce((n, f) => Math.max(n, f.number), 0);
    this.fd = null;
    this.unsaved = [];
  }

  files() {
    const dir = path.dirname(this.dbPath);
    const prefix = `${path.basename(this.dbPath)}.journal.`;
    if (!fs.existsSync(dir)) {
      return [];
    }
    return fs
      .readdirSync(dir)
      .filter((name) => name.startsWith(prefix) && /^\d+$/.test(name.slice(prefix.length)))
      .map((name) => ({ file: path.join(dir, name), number: Number(name.slice(prefix.length)) }))
      .sort((a, b) => a.number - b.number);
  }

  append(entries) {
    if (this.fd === null) {
      this.rotate();
    }
    fs.writeSync(this.fd, entries.map((e) => `${JSON.stringify(e)}\n`).join(""));
  }

  /** Start a new file; returns the files a save begun now covers: every one written
   * since the last save that succeeded (a failed save's files wait for the next one, so
   * an older image is never replayed over a newer database). */
  rotate() {
    if (this.fd !== null) {
      fs.closeSync(this.fd);
    }
    const covered = [...this.unsaved];
    this.number += 1;
    const file = `${this.dbPath}.journal.${this.number}`;
    this.fd = fs.openSync(file, "a");
    this.unsaved.push(file);
    return covered;
  }

  saved(covered) {
    for (const file of covered) {
      fs.rmSync(file, { force: true });
    }
    this.unsaved = this.unsaved.filter((file) => !covered.includes(file));
  }
}

const Store = require(
  path.join(azuriteSource(), "table", "persistence", "LokiTableMetadataStore.js"),
).default;
const state = new WeakMap();

function durable(store) {
  let found = state.get(store);
  if (found === undefined) {
    found = { journal: null, batches: new Map() };
    state.set(store, found);
  }
  return found;
}

function image(store, table, account, partitionKey, rowKey) {
  const name = store.getTableCollectionName(account, table);
  const coll = store.db.getCollection(name);
  const doc = coll === null ? null : coll.findOne({ PartitionKey: partitionKey, RowKey: rowKey });
  return { c: name, pk: partitionKey, rk: rowKey, doc: doc === null ? null : clean(doc) };
}

function replay(store, file) {
  const lines = fs.readFileSync(file, "utf8").split("\n");
  for (const line of lines) {
    let entry;
    try {
      entry = JSON.parse(line);
    } catch {
      continue; // an empty last line, or one cut short by the kill: never answered
    }
    const coll = store.db.getCollection(entry.c);
    if (coll === null) {
      continue; // the table was deleted afterwards (and that was saved)
    }
    const existing = coll.findOne({ PartitionKey: entry.pk, RowKey: entry.rk });
    if (existing !== null) {
      coll.remove(existing);
    }
    if (entry.doc !== null) {
      coll.insert(entry.doc);
    }
  }
}

const init = Store.prototype.init;
Store.prototype.init = async function durableInit() {
  await init.call(this);
  if (!onDisk(this)) {
    return;
  }
  const journal = new Journal(this.lokiDBPath);
  durable(this).journal = journal;
  const db = this.db;
  const saveInternal = db.saveDatabaseInternal;
  db.saveDatabaseInternal = function journaledSave(callback) {
    const covered = journal.rotate();
    saveInternal.call(db, (err) => {
      if (!err) {
        journal.saved(covered);
      }
      if (typeof callback === "function") {
        callback(err);
      }
    });
  };
  if (journal.left.length > 0) {
    for (const { file } of journal.left) {
      replay(this, file);
    }
    await save(this);
    for (const { file } of journal.left) {
      fs.rmSync(file, { force: true });
    }
    journal.left = [];
  }
};

for (const [name, keys] of Object.entries(ENTITY_WRITES)) {
  const write = Store.prototype[name];
  Store.prototype[name] = async function journaledWrite(...args) {
    const result = await write.apply(this, args);
    const { journal, batches } = durable(this);
    if (journal !== null) {
      const [table, account, partitionKey, rowKey, batchId] = keys(args);
      const batch = batchId === undefined ? undefined : batches.get(batchId);
      if (batch !== undefined) {
        batch.push([table, account, partitionKey, rowKey]);
      } else {
        journal.append([image(this, table, account, partitionKey, rowKey)]);
      }
    }
    return result;
  };
}

for (const name of RARE_WRITES) {
  const write = Store.prototype[name];
  Store.prototype[name] = async function savedWrite(...args) {
    const result = await write.apply(this, args);
    if (durable(this).journal !== null) {
      await save(this);
    }
    return result;
  };
}

const begin = Store.prototype.beginBatchTransaction;
Store.prototype.beginBatchTransaction = async function journaledBegin(batchId) {
  durable(this).batches.set(batchId, []);
  return begin.call(this, batchId);
};

const end = Store.prototype.endBatchTransaction;
Store.prototype.endBatchTransaction = async function journaledEnd(...args) {
  try {
    return await end.apply(this, args);
  } finally {
    const { journal, batches } = durable(this);
    const touched = batches.get(args[2]) || [];
    batches.delete(args[2]);
    if (journal !== null && touched.length > 0) {
      journal.append(touched.map((keys) => image(this, ...keys)));
    }
  }
};
