"""Released migrations never change: a database that ran one keeps what it made,
so an edit reaches only new databases and splits the schema in two (MySQL's 0001
was edited three times after its release; 0019 repairs what that left behind).

Every migration file is pinned here by its SHA-256. A change to a schema is a new
migration, whose author adds its line below; CI fails on any other change."""

from __future__ import annotations

import hashlib
from pathlib import Path

BACKENDS = Path(__file__).resolve().parents[2] / "src" / "conveyor" / "backends"

#: dialect, file name (without .sql), SHA-256 of the file
RELEASED = """
sqlite 0001_init 3af9f33e9bbaa9ef51199f9a0501d393fe69b5a2848883bf55dc1c804353f33e
sqlite 0002_flows c6d638e69a2940adfe3c4068d38877ef24cb95549f129e8b077058bc45ab07f8
sqlite 0003_control bbeb445439f9180ba719d05219eed48da9324a3a26cedcc23d86d688734d001c
sqlite 0004_limits b1f1d66ac179a1c46065a0df698f27c15dba2c958abd7f10e3a761c714428edb
sqlite 0005_rate_limits eb863e8bae39db10e3b27f0ce8d8d9826b1bd65a802b5e7dcbe14d6d0310228d
sqlite 0006_placement 25e1735dc04726a6e7521a45f46c65d12c191c434224b422fb6ac6ec026e0ba8
sqlite 0007_queue_rate 5f9cd2895b63a682af54698e53742313bfd6d4d5c59169aa0115828e6718b1da
sqlite 0008_liveness 7104a09594a36e21e219e3d1973e86d9ffdf84fdf3052ea13d5fd4c5a2e20e07
sqlite 0009_events 65c8a6dfa963259820f019e2f09887b7cd93dc1cce0d9fde16b008ad280553ab
sqlite 0010_server cc05e790e91055d092161be434cc4f5d56fe6f4f696ffc526509e997d36b7cac
sqlite 0011_counts d3ffbb773702bf2ca533278ba809514e7a87a262562b00ec85b6f6558cc3605c
sqlite 0012_hot_paths 676ea4427cdd0c66526db4be3731f75f56e5e37788ab29d82a9b1f24f6cb2e70
sqlite 0013_actions eccdbc05616c613e2216c3ad27ad9deef5b18af9715cc989085897b25431b1a4
sqlite 0014_indexes d6721665ad60203c10d98d2cefc53a11cd449a58a989b375cd6d535e43451a21
sqlite 0015_running_keys c4c37c311990e430d0b7f9ba7440b0324b5aa61a33f5ccfd75d6d99bc5366f78
sqlite 0016_batch_counts 962bf218b87526cf6ae9567f99ca43c9204aaac10daa5c4f5b47e82b6d769796
sqlite 0017_partitions 13253882c4204d21cd49f20d43a6c025757a407261c4cb4a7ac43c7b50458059
sqlite 0018_copy_defaults 0e0f9bb7dbd04ce36271c92ee8901065704a159071e7d03a0d4fba7acf626707
sqlite 0019_repair 5f8abd441fc01ecdfe18dfe8f8ab67fa71e7e5c6d83aecd969fbf41cd61f80d1
sqlite 0020_sensitive_arguments f47b9ff480f88b855eb58878a32d12ad39cc944f3e29381297dbd8a26da022a0
sqlite 0021_batch_fingerprint edd6468c97368081af993d3f845f6810d1c4661601c8dc7dde4e424891318851
sqlite 0022_partitions 6c8f32f8fa58e8850d6729263be87676ef3b26332c8b9f9273499d48625a2d47
postgres 0001_init aa55dd205d61578dfdfb0ba48898fe67e984de5cc51055fc46c144821831a46b
postgres 0002_flows e44da9ce6d9190c7316e2c75db7b0d2dfded7e36ee70fda205277e7b691b81a0
postgres 0003_control c687fcdd9b350bbc9f781e9ef5bae88194cc2ed427187bd50cc742ce339d868f
postgres 0004_limits 6127c6b4492a3b651cb2e80ad635d1a4d1f700f2ac285d2e1900458cf5cba258
postgres 0005_rate_limits 1c98ce4aeeb6755c99ff93660003c2fda5f7b0efd19c78898d19d9c734eac88c
postgres 0006_placement 084ece5f29ebb28eb918764563cabcd9431c8697754f160e4a06d17baa642aba
postgres 0007_queue_rate a678c5532f4b9c342fd8604033bf9a458a7925eca65a384524ac15817f826a15
postgres 0008_liveness 7e25725d5d2b3423fe0486acb369f7aa4e7c4cbf561a43e05ab759a88ff846a3
postgres 0009_events 0f5aeca58cb408402ed6ff3648fb2be0ed5b659efdcb3beaad0ad11591cbec7f
postgres 0010_server 13a2e995fc393e0d73dec8337b752931deb3ce792951f490f49cc242153edbe0
postgres 0011_counts d8770d00db0e3919ccad6fbdfdc7a5fb3b01ae12f3c36aafa50653476c4958ee
postgres 0012_hot_paths 06ecba54b35bf18b8d4866afd8bc14039479e503c20e352f6fb60327cbe3fa29
postgres 0013_actions 7d301426603eb63e6af4d557881f413663914d085fea02af5913b5adebe4bb71
postgres 0014_indexes 35d89ff3b8cb342b6383eac62a70118c42d524b2f5cf559ca3c33d2e397964c9
postgres 0015_running_keys 651cca2ff3301e9ff67ea44ac7cb4a782f5bd0d5612b71df4307931f69b46934
postgres 0016_batch_counts 979721e2ce07f326496be34607a405103b026c65c7ab1cff2efa32f802888064
postgres 0017_partitions 5db7ac5e22bda2959d623263c43efb257c610925c653e149994e003658b52512
postgres 0018_copy_defaults 01d59b3e05e8e5f3eab15fb57a88affeb3b96e19cb5a1b25452282ae1c4c4b0f
postgres 0019_repair 6d06664d440bb462710dd3f55d53378f7fc41c886c728b97626b802e0edaa903
postgres 0020_sensitive_arguments 38d3ec265dc3798de50e1966dc79478bb5e14f79c0c425c660c8832f40beb61d
postgres 0021_batch_fingerprint f12eb472d95a07cf48ab425ac193029c39675bfac5fd0cfe66cbc4ef36d2d637
postgres 0022_partitions 6c8f32f8fa58e8850d6729263be87676ef3b26332c8b9f9273499d48625a2d47
mysql 0001_init 6e4fb056b2359abdadb8aa2983b703be4b90097738f75ef4873d7c0bfe241c15
mysql 0002_flows f1c289f501e1dfb7e72bdf611910fd947ed74f68544601c694844d832ec07430
mysql 0003_control d34116ab1449c2211431b29abebf50d834cd1aafef316a109d539283dce7931e
mysql 0004_limits ecbfb0387d06fe4d34e5bfeec98cd9a2654d3cd37110d84e75dd9f5e9f8cf702
mysql 0005_rate_limits f45afc6335c05c3a750c7dccd14a76381f876a1b7e8320090cb1a26032a01e0e
mysql 0006_placement 35e4accb10dd5dec894c64826ebe88a0f438c80d45b36dc389ea22d37159dd91
mysql 0007_queue_rate 785daceeddd389819321102332f3b995838c1bb641018aeaa4c74d9b23054e06
mysql 0008_liveness 4daae4ddaad64e97a473d1b64f5822018b6ad0de483028adf6beb479a76e3c4e
mysql 0009_events d49ebdb6bbcc5fe1b7cb071aabf823545f3a7d97566ce8bded5b7b6285dc3847
mysql 0010_server e3fef7b456b36b5fb3e38e54099c0e3acd59619e953d3fe6a7e7ed24a2de95f3
mysql 0011_counts 562a3cac1b033c6d783cb42caf12138aca7892d1cbf4858ed7fe99563c980238
mysql 0012_hot_paths 65e6780528642accb871a236dc9f0984e62c1bf77d35231a4c9fd6a0597e66eb
mysql 0013_actions a4221247ebd12723e3dc82fa334d6f2e5413949d3fe6cb5658f09ef4e68464af
mysql 0014_indexes 330bc88d6f32df7fa43be7152fd02521138e2682ce559475f5c6e4c67c06424d
mysql 0015_running_keys 0369f46884f82f083409ac4ad4bc9cb61d5348e103a7e3a8efe2dbf84788ca56
mysql 0016_batch_counts 9c81101f3dfd1651f383c22dc97925b1861bc2a13de4a400b271881aa5904a36
mysql 0017_partitions 13253882c4204d21cd49f20d43a6c025757a407261c4cb4a7ac43c7b50458059
mysql 0018_copy_defaults 0e0f9bb7dbd04ce36271c92ee8901065704a159071e7d03a0d4fba7acf626707
mysql 0019_repair 9f75d5876281ee3f7547a69d6e7c2da3fded3c0c7924facc4d63c532655942ac
mysql 0020_sensitive_arguments dd445ba9c811be1836c7713cc4d325ac8b86800b68a6f1c9724d1aa0f7f66815
mysql 0021_batch_fingerprint 9a19909d2314204fbeb4bf176104727f1725cb349cbd3455a388f1ef44becf30
mysql 0022_partitions 6cb3313bfd9b23d348079bfb79142268cf0968b9fbb99b4c071f19923d0dbb62
"""


def _pinned() -> dict[str, str]:
    rows = (line.split() for line in RELEASED.strip().splitlines())
    return {f"{dialect}/{name}.sql": digest for dialect, name, digest in rows}


def test_no_released_migration_changed():
    pinned = _pinned()
    found = {
        f"{p.parent.parent.name}/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(BACKENDS.glob("*/migrations/*.sql"))
    }
    changed = sorted(name for name in pinned if found.get(name) != pinned[name])
    assert changed == [], (
        f"released migrations changed or went: {changed}. A released migration is never "
        "edited (databases that ran it keep what it made): write a new one instead"
    )
    new = sorted(set(found) - set(pinned))
    assert new == [], f"migrations not pinned yet: {new}; add their SHA-256 to RELEASED"


def test_every_dialect_has_the_same_versions():
    versions: dict[str, list[str]] = {}
    for name in _pinned():
        dialect, file = name.split("/")
        versions.setdefault(dialect, []).append(file[:4])
    assert versions["sqlite"] == versions["postgres"] == versions["mysql"]
