from compaction_proxy.ops.cli import main

raise SystemExit(main())
